"""The chunked dataset format: round trip, and every bad chunk as one line naming it."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from graphrun.cli import main
from graphrun.errors import DatasetError, HostError
from graphrun.graph import save_dataset
from graphrun.graph.chunked import (
    load_chunked_meta,
    load_chunked_whole,
    rank_chunks,
    read_chunks,
    save_chunked,
)
from graphrun.testing.graphs import community_graph, hetero_graph


def same_graph(a, b) -> None:
    assert a.num_nodes == b.num_nodes and a.node_types == b.node_types
    assert a.edge_types == b.edge_types
    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)
    for t, feats in a.ndata.items():
        for name, arr in feats.items():
            assert np.array_equal(b.ndata[t][name], arr)
    for k, feats in a.edata.items():
        for name, arr in feats.items():
            assert np.array_equal(b.edata[k][name], arr)


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_round_trip_homogeneous_and_hetero(tmp_path: Path, chunks: int) -> None:
    for name, g in (("homo", community_graph(200, 1500, seed=1)), ("hetero", hetero_graph())):
        ids = {"paper": np.arange(50, dtype=np.int64) * 3} if name == "hetero" else None
        save_chunked(g, tmp_path / name / "c", chunks, ids)
        back, raw = load_chunked_whole(tmp_path / name / "c")
        same_graph(g, back)
        if ids:
            assert np.array_equal(raw["paper"], ids["paper"])
        meta = load_chunked_meta(tmp_path / name / "c")
        assert meta.num_chunks == chunks
        # each chunk holds its node range's rows of every type, and its edge range
        k = chunks // 2
        one = read_chunks(meta, [k])
        a, b = one.nodes
        assert one.nodes == (int(meta.node_bounds[k]), int(meta.node_bounds[k + 1]))
        assert np.array_equal(one.src, g.src[one.edges[0] : one.edges[1]])
        nto = g.node_type_offsets
        for t, ntype in enumerate(g.node_types):
            lo, hi = max(a, nto[t]) - nto[t], max(min(b, nto[t + 1]), max(a, nto[t])) - nto[t]
            for fname, arr in g.ndata.get(ntype, {}).items():
                assert np.array_equal(one.ndata[ntype][fname], arr[lo:hi])


def test_ranks_read_every_chunk_once() -> None:
    for n, w in ((4, 2), (5, 3), (3, 3), (8, 1)):
        seen = [k for r in range(w) for k in rank_chunks(n, r, w)]
        assert seen == list(range(n))
        assert all(len(rank_chunks(n, r, w)) >= 1 for r in range(w))


@pytest.fixture
def chunked(tmp_path: Path) -> Path:
    path = tmp_path / "c"
    save_chunked(hetero_graph(), path, 3)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(DatasetError) as info:
        meta = load_chunked_meta(path)
        for k in range(meta.num_chunks):
            read_chunks(meta, [k])
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_missing_chunk(chunked: Path) -> None:
    shutil.rmtree(chunked / "chunk-1")
    assert "chunk-1: missing (chunk 1 of 3)" in error_of(chunked)


def test_missing_or_unreadable_array(chunked: Path) -> None:
    (chunked / "chunk-2" / "dst.npy").unlink()
    assert error_of(chunked).endswith("chunk-2/dst.npy: missing")
    (chunked / "chunk-2" / "dst.npy").write_bytes(b"not an array")
    assert "chunk-2/dst.npy: not a readable .npy array" in error_of(chunked)


def test_chunk_of_another_dataset(chunked: Path, tmp_path: Path) -> None:
    save_chunked(hetero_graph(seed=1), tmp_path / "other", 3)
    shutil.rmtree(chunked / "chunk-1")
    shutil.copytree(tmp_path / "other" / "chunk-1", chunked / "chunk-1")
    msg = error_of(chunked)
    assert "chunk-1/chunk.json: field 'dataset_id'" in msg and "mixed" in msg


def test_chunks_disagreeing_on_counts(chunked: Path) -> None:
    meta = json.loads((chunked / "chunk-0" / "chunk.json").read_text())
    meta["edges"][1] += 1
    (chunked / "chunk-0" / "chunk.json").write_text(json.dumps(meta))
    assert "chunk-0/chunk.json: field 'edges'" in error_of(chunked)


def test_feature_rows_and_types_checked(chunked: Path) -> None:
    f = chunked / "chunk-2" / "node" / "paper" / "feat.npy"
    np.save(f, np.load(f)[:-1])
    assert "chunk-2/node/paper/feat.npy: dtype float32 shape" in error_of(chunked)
    np.save(f, np.load(f).astype(np.float64))
    assert "expected float32" in error_of(chunked)


def test_endpoint_of_the_wrong_type(chunked: Path) -> None:
    f = chunked / "chunk-0" / "dst.npy"
    dst = np.load(f)
    dst[0] = 0  # an author, but edges 0.. are author-writes->paper
    np.save(f, dst)
    assert "chunk-0/dst.npy: row 0 = 0 is not a 'paper' node" in error_of(chunked)


def test_whole_dataset_is_not_chunked(tmp_path: Path) -> None:
    save_dataset(hetero_graph(), tmp_path / "d")
    assert "a whole dataset, not a chunked one" in error_of(tmp_path / "d")


def test_generate_writes_chunks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "academic", str(tmp_path / "a"), "--nodes", "300", "--chunks", "4"]
    assert main([*argv, "--avg-degree", "6", "--feat-dim", "4"]) == 0
    assert "in 4 chunks" in capsys.readouterr().out
    g, _ = load_chunked_whole(tmp_path / "a")
    assert g.is_hetero and g.num_nodes == 300
    assert main(["generate", "community", str(tmp_path / "b"), "--chunks", "0"]) == 2
    assert "--chunks" in capsys.readouterr().err


def test_import_writes_chunks_with_raw_ids(tmp_path: Path) -> None:
    from graphrun.graph import import_graph

    src = tmp_path / "csv"
    src.mkdir()
    (src / "edges.csv").write_text("src,dst\na,b\nb,c\nc,a\nd,a\n")
    assert main(["import", str(src), str(tmp_path / "out"), "--chunks", "2"]) == 0
    g, raw = load_chunked_whole(tmp_path / "out")
    ref = import_graph(src)
    same_graph(ref.graph, g)
    assert raw.keys() == ref.id_maps.keys()
    for ntype, ids in ref.id_maps.items():
        assert np.array_equal(raw[ntype], ids)


def big_graph():
    """64 MiB of endpoints and 32 MiB of features: a read that holds them all shows."""
    from graphrun.graph import Graph

    n, m = 1 << 17, 1 << 22
    rng = np.random.default_rng(0)
    return Graph(
        num_nodes=n,
        src=rng.integers(0, n, m),
        dst=rng.integers(0, n, m),
        ndata={"_N": {"feat": rng.random((n, 64), dtype=np.float32)}},
    )


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_reading_a_chunk_checks_it_a_slice_at_a_time(tmp_path: Path) -> None:
    # the checks read every endpoint and feature of a mapped chunk (64 MiB of endpoints,
    # 32 MiB of features here): they must not leave it all resident
    from graphrun.partition.peaks import Phases

    g = big_graph()
    n, m = g.num_nodes, g.num_edges
    save_chunked(g, tmp_path / "c", 1)
    del g
    meta = load_chunked_meta(tmp_path / "c")
    clock = Phases()
    rss = rss_mb()
    clock.start("read")
    chunk = read_chunks(meta, [0])
    clock.start("")
    assert chunk.src.shape == (m,) and chunk.ndata["_N"]["feat"].shape == (n, 64)
    assert clock.per_phase and clock.phases["read"]["peak_rss_mb"] - rss < 48


def test_a_whole_chunked_graph_is_joined_in_mapped_files_not_in_memory(tmp_path: Path) -> None:
    # --mode parallel and single read every chunk into one graph: 4.0 GiB at 2M / 80M
    # against 1.7 for the same dataset unchunked, whose files are mapped
    from graphrun.partition.peaks import Phases

    g = big_graph()
    save_chunked(g, tmp_path / "c", 4)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    clock = Phases()
    rss = rss_mb()
    clock.start("read")
    back, _ = load_chunked_whole(tmp_path / "c", scratch)
    clock.start("")
    assert clock.per_phase and clock.phases["read"]["peak_rss_mb"] - rss < 48  # 96 MiB joined
    same_graph(g, back)
    assert isinstance(back.src, np.memmap) and not back.src.flags.writeable


def test_joining_chunks_on_a_full_disk_is_one_line_not_a_sigbus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the joined files' blocks are allocated before they are mapped, as the partitioner's
    # outputs are: a full scratch disk fails there, not with a SIGBUS on a write to the map
    save_chunked(community_graph(300, 2400, seed=3), tmp_path / "c", 3)
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(HostError, match="cannot write: no space left on device"):
        load_chunked_whole(tmp_path / "c", scratch)


def test_partitioning_a_chunked_dataset_leaves_no_scratch_and_equals_the_unchunked(
    tmp_path: Path,
) -> None:
    g = community_graph(300, 2400, seed=3)
    save_chunked(g, tmp_path / "c", 3)
    save_dataset(g, tmp_path / "d")
    out = tmp_path / "outs"
    out.mkdir()
    for name in ("c", "d"):
        assert main(["partition", str(tmp_path / name), str(out / name), "--parts", "2"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["c", "d"]  # no scratch left beside OUT
    for f in (out / "c").rglob("*.npy"):
        assert np.array_equal(np.load(f), np.load(out / "d" / f.relative_to(out / "c")))
