"""``graphrun partition``: output, and bad input as one line, exit 2, nothing left behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphrun.cli import main
from graphrun.errors import PartitionFormatError
from graphrun.graph import save_dataset
from graphrun.partition import load_partition, load_partition_book, load_partition_config
from graphrun.testing.graphs import community_graph, hetero_graph
from graphrun.testing.procs import run_graphrun


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ds") / "community"
    save_dataset(community_graph(300, 2400, num_communities=3, seed=5), path)
    return path


@pytest.fixture(scope="module")
def parted(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("p") / "parts"
    assert main(["partition", str(dataset), str(out), "--parts", "2"]) == 0
    return out


def only_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("graphrun: error: ")
    assert "Traceback" not in err[0]
    return err[0]


def test_cli_prints_edge_cut_and_balance(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "parts"
    argv = ["partition", str(dataset), str(out), "--parts", "3", "--balance-train", "--halo", "2"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "edge cut" in text and "balance" in text and "train" in text
    cfg = load_partition_config(out)
    assert cfg["halo_hops"] == 2 and cfg["balance"]["train"] is True
    assert cfg["quality"]["train_balance"] <= 1.0 + cfg["balance"]["tolerance"] + 1e-9


def test_cli_json_and_random(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["partition", str(dataset), str(tmp_path / "o"), "--parts", "2", "--method", "random"]
    assert main([*argv, "--json", "--balance-edges"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["method"] == "random" and res["parts"] == 2
    assert 0.0 < res["edge_cut"] <= 1.0 and res["edge_balance"] <= 1.05


def test_cli_parallel_mode_runs_kaminpar(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["partition", str(dataset), str(tmp_path / "o"), "--parts", "2", "--mode", "parallel"]
    assert main([*argv, "--json", "--balance-train"]) == 0
    res = json.loads(capsys.readouterr().out)
    phases = ["read", "graph", "assign", "relabel", "write"]
    assert res["method"] == "kaminpar" and list(res["phases"]) == phases
    assert list(res["phase_peak_mb"]) == phases
    assert res["peak_rss_mb"] == max(res["phase_peak_mb"].values()) > 0
    assert load_partition_config(tmp_path / "o")["method"] == "kaminpar"
    assert res["edge_cut"] < 0.5 and res["train_balance"] <= 1.05 + 1e-9


def test_cli_heterograph(tmp_path: Path) -> None:
    save_dataset(hetero_graph(), tmp_path / "h")
    assert main(["partition", str(tmp_path / "h"), str(tmp_path / "o"), "--parts", "2"]) == 0
    assert load_partition(tmp_path / "o", 1).etypes is not None


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--parts", "301"], "parts: 301 is larger than the node count (300)"),
        (["--parts", "0"], "--parts"),
        (["--parts", "2", "--halo", "-1"], "halo_hops"),
        (["--parts", "2", "--tolerance", "-1"], "--tolerance"),
        (["--parts", "2", "--tolerance", "nan"], "--tolerance"),
        (["--parts", "2", "--tolerance", "inf"], "--tolerance"),
        (["--parts", "2", "--mode", "distributed"], "a whole dataset, not a chunked one"),
        (["--parts", "2", "--mode", "distributed", "--method", "metis"], "--mode distributed runs"),
        (["--parts", "2", "--mode", "distributed", "--timeout", "0"], "--timeout: must be"),
        (["--parts", "2", "--mode", "parallel", "--method", "metis"], "--mode parallel uses"),
        (["--parts", "2", "--mode", "parallel", "--threads", "0"], "--threads: must be"),
        (["--parts", "2", "--threads", "2"], "--threads: only kaminpar takes threads"),
        # a rank's flags without --mode distributed partitioned the whole graph instead
        (["--parts", "2", "--rank", "0"], "--rank: only with --mode distributed, not --mode sin"),
        (["--parts", "2", "--rendezvous", "tcp://h:1"], "--rendezvous: only with --mode distrib"),
        (["--parts", "2", "--mode", "parallel", "--into", "x"], "--into: only with --mode distri"),
        (["--parts", "2", "--init", "hash"], "--init: only with --mode distributed"),
        (["--parts", "2", "--timeout", "5"], "--timeout: only with --mode distributed"),
        (
            ["--parts", "2", "--mode", "distributed", "--rendezvous", "tcp://h:1"],
            "--rendezvous: only with --rank",
        ),
        (["--parts", "2", "--mode", "distributed", "--into", "x"], "--into: only with --rank"),
        (["--parts", "2", "--mode", "distributed", "--rank", "0"], "--rank: needs --rendezvous"),
        (["--parts", "2", "--mode", "distributed", "--timeout", "1e300"], "--timeout: must be"),
        (
            ["--parts", "2", "--mode", "distributed", "--rank", "0", "--rendezvous", "nonsense"],
            "--rendezvous: 'nonsense' is not tcp://HOST:PORT",
        ),
        (
            ["--parts", "2", "--mode", "distributed", "--rank", "0", "--rendezvous", "tcp://h"],
            "--rendezvous: 'tcp://h' is not tcp://HOST:PORT (rank 0's address) or file://PATH: "
            "needs a host and a port",
        ),
        (
            ["--parts", "2", "--mode", "distributed", "--rank", "0", "--rendezvous", "tcp://h:0x"],
            "--rendezvous: 'tcp://h:0x' is not",
        ),
        (
            ["--parts", "2", "--mode", "distributed", "--rank", "0", "--rendezvous", "file://"],
            "no file named",
        ),
    ],
)
def test_bad_arguments(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    assert main(["partition", str(dataset), str(tmp_path / "o"), *extra]) == 2
    assert match in only_error_line(capsys)
    assert list(tmp_path.iterdir()) == []  # no partial output, no temp dir


def test_missing_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["partition", str(tmp_path / "nope"), str(tmp_path / "o"), "--parts", "2"]) == 2
    assert "nope" in only_error_line(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("breakage", "match"),
    [
        ("json", "graph.json: not valid JSON"),
        ("version", "field 'version' is 99"),
        ("missing-dst", "dst.npy: missing"),
        ("short-dst", "different lengths"),
        ("out-of-range", "out of range"),
        ("dtype", "dtype int64"),
    ],
)
def test_bad_dataset(
    dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], breakage: str, match: str
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("graph.json", "src.npy", "dst.npy"):
        (bad / f).write_bytes((dataset / f).read_bytes())
    meta = json.loads((bad / "graph.json").read_text())
    meta["node_features"] = meta["edge_features"] = {}
    dst = np.load(bad / "dst.npy")
    if breakage == "json":
        (bad / "graph.json").write_text('{"format": "graphrun-dataset", ')
    elif breakage == "version":
        meta["version"] = 99
    elif breakage == "missing-dst":
        (bad / "dst.npy").unlink()
    elif breakage == "short-dst":
        np.save(bad / "dst.npy", dst[:-1])
    elif breakage == "out-of-range":
        dst[7] = 10_000
        np.save(bad / "dst.npy", dst)
    elif breakage == "dtype":
        np.save(bad / "dst.npy", dst.astype(np.int32))
    if breakage != "json":
        (bad / "graph.json").write_text(json.dumps(meta))
    out = tmp_path / "o"
    assert main(["partition", str(bad), str(out), "--parts", "2"]) == 2
    assert match in only_error_line(capsys)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_existing_output_is_left_alone(
    dataset: Path, parted: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in parted.iterdir())
    assert main(["partition", str(dataset), str(parted), "--parts", "2"]) == 2
    assert "not empty" in only_error_line(capsys)
    assert sorted(p.name for p in parted.iterdir()) == before


def copy_tree(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda c: c.update(version=2), "field 'version' is 2; this graphrun reads version 1"),
        (lambda c: c.update(format="dgl"), "field 'format'"),
        (lambda c: c.pop("node_offsets"), "field 'node_offsets' is missing"),
        (lambda c: c.update(node_offsets=[0, 1, 2]), "node_offsets"),
        (lambda c: c.update(parts=[]), "field 'parts'"),
        (lambda c: c["parts"][0].update(num_local_nodes="x"), r"parts\[0\].num_local_nodes"),
        (lambda c: c["parts"][0].update(dir="../x"), r"parts\[0\]: dir: '\.\./x' is not a plain"),
        (lambda c: c.update(halo_hops="x"), "halo_hops: Expected `int`, got `str`"),
        (lambda c: c.update(halo_hops=-1), "halo_hops: must be >= 0"),
        (lambda c: c["quality"].update(edge_cut="x"), r"quality\.edge_cut: Expected `float`"),
        (lambda c: c.update(node_features={"_N": {"f": {"shape": [1]}}}), "dtype: missing"),
    ],
)
def test_bad_partition_config(parted: Path, tmp_path: Path, edit, match: str) -> None:  # type: ignore[no-untyped-def]
    d = copy_tree(parted, tmp_path / "p")
    cfg = json.loads((d / "partition.json").read_text())
    edit(cfg)
    (d / "partition.json").write_text(json.dumps(cfg))
    with pytest.raises(PartitionFormatError, match=match) as info:
        load_partition(d, 0)
    assert "partition.json" in str(info.value)
    with pytest.raises(PartitionFormatError):
        load_partition_book(d)


def test_corrupt_partition_files(parted: Path, tmp_path: Path) -> None:
    d = copy_tree(parted, tmp_path / "p")
    (d / "partition.json").write_text("{not json")
    with pytest.raises(PartitionFormatError, match=r"partition\.json: not valid JSON"):
        load_partition(d, 0)
    d = copy_tree(parted, tmp_path / "q")
    (d / "part-1" / "indices.npy").unlink()
    with pytest.raises(PartitionFormatError, match=r"part-1/indices.npy: missing"):
        load_partition(d, 1)
    (d / "part-0" / "nodes.npy").write_bytes(b"garbage")
    with pytest.raises(PartitionFormatError, match=r"part-0/nodes.npy: not a readable"):
        load_partition(d, 0)
    with pytest.raises(PartitionFormatError, match="has no partition 5"):
        load_partition(d, 5)
    with pytest.raises(PartitionFormatError, match="no such partition directory"):
        load_partition(tmp_path / "absent", 0)


def test_command_line_process(dataset: Path, tmp_path: Path) -> None:
    """The real command: exit 2, one line on stderr, no traceback."""
    proc = run_graphrun("partition", str(dataset), str(tmp_path / "o"), "--parts", "1000")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_cli_accepts_an_importable_npy_folder(tmp_path: Path) -> None:
    folder = tmp_path / "raw"
    folder.mkdir()
    g = community_graph(50, 300, num_communities=2, seed=0)
    np.save(folder / "src.npy", np.asarray(g.src))
    np.save(folder / "dst.npy", np.asarray(g.dst))
    assert main(["partition", str(folder), str(tmp_path / "o"), "--parts", "2"]) == 0
    assert load_partition_book(tmp_path / "o").num_nodes == 50


def test_balance_train_needs_training_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "raw"
    folder.mkdir()
    np.save(folder / "src.npy", np.array([0, 1, 2], np.int64))
    np.save(folder / "dst.npy", np.array([1, 2, 0], np.int64))
    argv = ["partition", str(folder), str(tmp_path / "o"), "--parts", "2", "--balance-train"]
    assert main(argv) == 2
    assert "train_mask" in only_error_line(capsys)
    assert list(tmp_path.iterdir()) == [folder]  # neither OUT nor its temporary


def test_raw_ids_of_an_imported_csv_survive(tmp_path: Path) -> None:
    from graphrun.partition import load_id_mapping

    src = tmp_path / "csv"
    src.mkdir()
    names = [f"user{i}" for i in range(12)]
    rows = [(names[i], names[(i * 5 + 1) % 12]) for i in range(12)]
    rows += [(names[i], names[(i + 1) % 12]) for i in range(12)]
    (src / "edges.csv").write_text("src,dst\n" + "".join(f"{a},{b}\n" for a, b in rows))
    out = tmp_path / "o"
    assert main(["partition", str(src / "edges.csv"), str(out), "--parts", "3"]) == 0
    mp = load_id_mapping(out)
    raw = mp.raw_ids["_N"]
    assert sorted(raw.tolist()) == sorted(names)
    # every edge, read back through the partitions and mappings, names the same users
    seen = set()
    for p in range(3):
        part = load_partition(out, p)
        rows_of = np.repeat(np.arange(len(part.nodes)), np.diff(part.indptr))
        _, s_orig = mp.orig_of_new(part.indices)
        _, d_orig = mp.orig_of_new(part.nodes[rows_of])
        seen |= {(str(raw[a]), str(raw[b])) for a, b in zip(s_orig, d_orig, strict=True)}
    assert seen == set(rows)
    new = mp.new_of_orig("_N", np.arange(12))
    assert (mp.orig_of_new(new)[1] == np.arange(12)).all()


def test_single_mode_reads_a_chunked_dataset_whole(tmp_path: Path) -> None:
    from graphrun.graph.chunked import save_chunked
    from graphrun.partition import load_id_mapping

    g = hetero_graph()
    save_chunked(g, tmp_path / "c", 3, {"paper": np.arange(50, dtype=np.int64) + 100})
    assert main(["partition", str(tmp_path / "c"), str(tmp_path / "o"), "--parts", "2"]) == 0
    mp = load_id_mapping(tmp_path / "o")
    assert mp.orig_nids.shape == (g.num_nodes,)
    assert np.array_equal(mp.raw_ids["paper"], np.arange(50) + 100)
