"""`graphrun generate` and `graphrun import`, including every bad input."""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphrun.cli import main
from graphrun.graph import load_dataset, save_dataset
from graphrun.graph.format import load_id_maps
from graphrun.graph.generate import GenParams, community
from graphrun.testing.procs import run_graphrun


def test_generate_community_and_academic(tmp_path, capsys) -> None:
    out = tmp_path / "c"
    rc = main(
        [
            "generate",
            "community",
            str(out),
            "--nodes",
            "1000",
            "--avg-degree",
            "8",
            "--classes",
            "4",
            "--feat-dim",
            "5",
            "--seed",
            "7",
        ]
    )
    assert rc == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "1000 nodes, 8000 edges" in line
    g = load_dataset(out)
    assert g.ndata["_N"]["feat"].shape == (1000, 5)
    assert set(np.unique(g.ndata["_N"]["label"])) == {0, 1, 2, 3}
    assert main(["generate", "academic", str(tmp_path / "a"), "--nodes", "800"]) == 0
    assert load_dataset(tmp_path / "a").node_types == ("paper", "author", "institution", "field")


def test_generate_takes_its_flags_from_genparams() -> None:
    """Every GenParams field is a flag with the field's default and help (issue 41, item
    8: the command restated the twelve fields by hand)."""
    import argparse
    import dataclasses

    from graphrun.arguments import from_fields
    from graphrun.cli import generate

    subparsers = argparse.ArgumentParser().add_subparsers()
    generate.register(subparsers)
    sub = subparsers.choices["generate"]
    help_text = " ".join(sub.format_help().split())
    for f in dataclasses.fields(GenParams):
        assert f"--{f.name.replace('_', '-')} " in help_text
        assert f.metadata["help"] in help_text
    assert "number of nodes (default 10000)" in help_text
    assert "edges per node, counting both directions (default 20)" in help_text
    assert "dataset name (default: the kind)" in help_text
    args = sub.parse_args(["community", "out", "--avg-degree", "7", "--name", "g"])
    assert from_fields(GenParams, args) == GenParams(avg_degree=7.0, name="g")
    assert from_fields(GenParams, sub.parse_args(["academic", "out"])) == GenParams()


def test_add_fields_picks_and_changes_defaults() -> None:
    import argparse
    import dataclasses

    from graphrun.arguments import add_fields, from_fields

    @dataclasses.dataclass(frozen=True)
    class Params:
        size: int = dataclasses.field(default=3, metadata={"help": "how many"})
        rate: float = dataclasses.field(default=0.5, metadata={"help": "how fast"})
        label: str = "x"

    parser = argparse.ArgumentParser()
    add_fields(parser, Params, only=("size", "rate"), defaults={"size": 9})
    assert from_fields(Params, parser.parse_args([])) == Params(size=9)
    assert from_fields(Params, parser.parse_args(["--rate", "2"])) == Params(size=9, rate=2.0)
    assert "--label" not in parser.format_help()
    assert "how many (default 9)" in " ".join(parser.format_help().split())
    with pytest.raises(SystemExit):
        parser.parse_args(["--size", "1.5"])  # typed by the default: an int


def test_import_csv_keeps_the_id_mapping(tmp_path, capsys) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    (src / "edges.csv").write_text("src,dst\nx,y\ny,z\n")
    rc = main(["import", str(src), str(tmp_path / "ds")])
    assert rc == 0
    assert "3 nodes, 2 edges" in capsys.readouterr().out
    assert load_id_maps(tmp_path / "ds")["_N"].tolist() == ["x", "y", "z"]


def test_import_npy(tmp_path, capsys) -> None:
    src = tmp_path / "raw"
    src.mkdir()
    np.save(src / "src.npy", np.array([0, 1, 2]))
    np.save(src / "dst.npy", np.array([1, 2, 0]))
    np.save(src / "train_idx.npy", np.array([0]))
    assert main(["import", str(src), str(tmp_path / "ds"), "--format", "npy"]) == 0
    assert load_dataset(tmp_path / "ds").ndata["_N"]["train_mask"].tolist() == [1, 0, 0]


# ---- bad inputs: one line on stderr, exit 2, nothing written ----------------------


def npy(**arrays) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        d.mkdir()
        for k, v in arrays.items():
            np.save(d / f"{k}.npy", v)

    return make


def files(**texts: str) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        d.mkdir()
        for k, v in texts.items():
            p = d / k.replace("__dot__", ".").replace("__slash__", "/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(v)

    return make


def dataset(edit: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        save_dataset(community(GenParams(nodes=50, avg_degree=4, feat_dim=2)), d)
        edit(d)

    return make


def meta_edit(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        meta = json.loads((d / "graph.json").read_text())
        fn(meta)
        (d / "graph.json").write_text(json.dumps(meta))

    return edit


def corrupt_parquet(d: Path) -> None:
    d.mkdir()
    (d / "edges.parquet").write_bytes(b"PAR1 this is not parquet")


def hetero_bad_etype(d: Path) -> None:
    d.mkdir()
    pq.write_table(pa.table({"src": [1], "dst": [2], "etype": ["a:b"]}), d / "edges.parquet")
    pq.write_table(pa.table({"id": [1, 2], "type": ["a", "b"]}), d / "nodes.parquet")


I64 = np.int64
BAD_IMPORTS = {
    "missing dir": (lambda d: None, [], "no such file or directory"),
    "nothing importable": (files(readme__dot__txt="hi"), [], "not a graphrun dataset"),
    "missing src.npy": (npy(dst=np.array([1])), ["--format", "npy"], "src.npy: missing"),
    "missing dst.npy": (npy(src=np.array([1])), [], "dst.npy: missing"),
    "lengths differ": (npy(src=np.arange(3), dst=np.arange(2)), [], "dst.npy: has 2 entries"),
    "float ids": (npy(src=np.ones(2), dst=np.ones(2, I64)), [], "src.npy: expected an integer"),
    "negative id": (npy(src=np.array([0, -4]), dst=np.ones(2, I64)), [], "src.npy: entry 1 is -4"),
    "idx out of range": (
        npy(src=np.arange(3), dst=np.arange(3), val_idx=np.array([1, 3])),
        [],
        "val_idx.npy: entry 1 is node 3, out of range [0, 3)",
    ),
    "feat rows": (
        npy(src=np.arange(3), dst=np.arange(3), feat=np.ones((2, 4))),
        [],
        "feat.npy: has 2 rows",
    ),
    "label dtype": (
        npy(src=np.arange(2), dst=np.arange(2), label=np.array([0.5, 1.0])),
        [],
        "label.npy: expected an integer dtype",
    ),
    "label length": (
        npy(src=np.arange(2), dst=np.arange(2), label=np.zeros((2, 2), I64)),
        [],
        "label.npy: expected 2 labels",
    ),
    "string feat": (
        npy(src=np.arange(2), dst=np.arange(2), feat=np.array(["a", "b"])),
        [],
        "feat.npy: expected a numeric dtype",
    ),
    "corrupt npy": (
        files(src__dot__npy="garbage", dst__dot__npy="x"),
        [],
        "src.npy: not a readable .npy",
    ),
    "csv no dst": (
        files(edges__dot__csv="src,to\n1,2\n"),
        [],
        "edges.csv: column 'dst' is missing",
    ),
    "csv float ids": (
        files(edges__dot__csv="src,dst\n1.5,2\n"),
        [],
        "column 'src' has type double",
    ),
    "csv empty id": (
        files(edges__dot__csv="src,dst\n1,2\n,3\n"),
        [],
        "column 'src' is empty in row 1",
    ),
    "csv ragged": (files(edges__dot__csv="src,dst\n1,2,3\n"), [], "edges.csv: cannot read as csv"),
    "csv unknown node": (
        files(edges__dot__csv="src,dst\n1,2\n", nodes__dot__csv="id\n1\n"),
        [],
        "edges.csv: row 0: dst id 2 is not a known '_N' node",
    ),
    "csv duplicate node": (
        files(edges__dot__csv="src,dst\n1,2\n", nodes__dot__csv="id\n1\n2\n1\n"),
        [],
        "nodes.csv: id 1 appears twice (rows 0 and 2)",
    ),
    "csv empty feature": (
        files(edges__dot__csv="src,dst\n1,2\n", nodes__dot__csv="id,feat_0\n1,0.5\n2,\n"),
        [],
        "nodes.csv: column 'feat_0' is empty in row 1",
    ),
    "csv string feature": (
        files(edges__dot__csv="src,dst\n1,2\n", nodes__dot__csv="id,name\n1,a\n2,b\n"),
        [],
        "nodes.csv: column 'name' has type string",
    ),
    "csv bad mask": (
        files(edges__dot__csv="src,dst\n1,2\n", nodes__dot__csv="id,train_mask\n1,1\n2,7\n"),
        [],
        "column 'train_mask' must be boolean or 0/1",
    ),
    "csv no etype": (
        files(edges__dot__csv="src,dst\n1,2\n", nodes__dot__csv="id,type\n1,a\n2,b\n"),
        [],
        "needs an 'etype' column",
    ),
    "csv bad edge file name": (
        files(edges__slash__ab__dot__csv="src,dst\n1,2\n"),
        [],
        "SRCTYPE__RELATION__DSTTYPE",
    ),
    "parquet corrupt": (corrupt_parquet, [], "edges.parquet: cannot read as parquet"),
    "parquet bad etype": (hetero_bad_etype, [], "column 'etype' value 'a:b'"),
    "dataset bad json": (
        dataset(lambda d: (d / "graph.json").write_text("{oops")),
        [],
        "graph.json: not valid JSON",
    ),
    "dataset version": (
        dataset(meta_edit(lambda m: m.update(version=7))),
        [],
        "field 'version' is 7",
    ),
    "dataset format": (
        dataset(meta_edit(lambda m: m.update(format="x"))),
        [],
        "field 'format' is 'x'",
    ),
    "dataset no num_nodes": (
        dataset(meta_edit(lambda m: m.pop("num_nodes"))),
        [],
        "graph.json: num_nodes: missing",
    ),
    "dataset features": (
        dataset(meta_edit(lambda m: m.update(node_features=[1]))),
        [],
        "graph.json: node_features: Expected `object`, got `array`",
    ),
    "dataset traversal": (
        dataset(
            meta_edit(
                lambda m: m.update(
                    node_features={"_N": {"../x": {"dtype": "float32", "shape": [50, 2]}}}
                )
            )
        ),
        [],
        "invalid name '../x'",
    ),
    "dataset counts": (
        dataset(meta_edit(lambda m: m["node_types"][0].update(count=49))),
        [],
        "node_type_offsets: must start at 0 and end at 50",
    ),
    "dataset missing dst": (dataset(lambda d: (d / "dst.npy").unlink()), [], "dst.npy: missing"),
    "dataset src dtype": (
        dataset(lambda d: np.save(d / "src.npy", np.load(d / "src.npy").astype(np.float64))),
        [],
        "src: expected dtype int64",
    ),
    "dataset feat rows": (
        dataset(lambda d: np.save(d / "node" / "_N" / "feat.npy", np.ones((3, 2)))),
        [],
        r"ndata['_N']['feat']: expected 50 rows",
    ),
    "dataset NaN features": (
        dataset(lambda d: np.save(d / "node" / "_N" / "feat.npy", np.full((50, 2), np.nan))),
        [],
        "ndata['_N']['feat']: 100 NaN or infinite values (first in row 0)",
    ),
}


def assert_clean_failure(rc: int, capsys, out: Path, fragment: str) -> None:
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("graphrun: error: ")
    assert fragment in lines[0], lines[0]
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))


@pytest.mark.parametrize("case", list(BAD_IMPORTS))
def test_bad_import_input(tmp_path, capsys, case) -> None:
    make, extra, fragment = BAD_IMPORTS[case]
    src, out = tmp_path / "src", tmp_path / "out"
    make(src)
    rc = main(["import", str(src), str(out), *extra])
    assert_clean_failure(rc, capsys, out, fragment)


def test_import_refuses_existing_output(tmp_path, capsys) -> None:
    npy(src=np.arange(2), dst=np.arange(2))(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    rc = main(["import", str(tmp_path / "src"), str(out)])
    captured = capsys.readouterr()
    assert rc == 2 and "already exists" in captured.err and captured.out == ""
    assert (out / "keep").read_text() == "mine"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--nodes", "1"], "--nodes: must be at least 2"),
        (["--homophily", "2"], "--homophily: must be in [0, 1]"),
        (["--avg-degree", "500", "--nodes", "100"], "--avg-degree"),
        (["--feat-dim", "0"], "--feat-dim"),
        (["--val-frac", "-0.1"], "--val-frac: must be a fraction in [0, 1]"),  # blamed train
        (["--train-frac", "nan"], "--train-frac: must be a fraction"),  # a traceback
        (["--seed", "-1"], "--seed: must be a non-negative integer"),  # a traceback
        (["--exponent", "inf"], "--exponent"),
    ],
)
def test_bad_generate_flags(tmp_path, capsys, args, fragment) -> None:
    out = tmp_path / "out"
    rc = main(["generate", "community", str(out), *args])
    assert_clean_failure(rc, capsys, out, fragment)


def test_real_process_prints_one_line_and_exits_2(tmp_path) -> None:
    (tmp_path / "src").mkdir()
    np.save(tmp_path / "src" / "src.npy", np.arange(3))
    np.save(tmp_path / "src" / "dst.npy", np.arange(4))
    proc = run_graphrun("import", str(tmp_path / "src"), str(tmp_path / "o"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "dst.npy: has 4 entries" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_errors_in_split_tables_name_the_file_row(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "edges.csv").write_text("src,dst,etype\n1,2,a:r:b\n2,1,b:s:a\n2,9,b:s:a\n")
    (src / "nodes.csv").write_text("id,type\n1,a\n2,b\n")
    rc = main(["import", str(src), str(tmp_path / "out")])
    assert_clean_failure(rc, capsys, tmp_path / "out", "edges.csv: row 2: dst id 9")


def test_type_names_must_be_safe(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "edges.csv").write_text("src,dst,etype\n1,2,a:r:b\n")
    (src / "nodes.csv").write_text("id,type\n1,a\n2,b\n3,../x\n")
    rc = main(["import", str(src), str(tmp_path / "out")])
    assert_clean_failure(rc, capsys, tmp_path / "out", "node type name '../x' is not allowed")


def test_add_fields_quiet_and_choices() -> None:
    """``metadata["quiet"]``: no default in the help; ``metadata["choices"]``: the values."""
    import argparse
    import dataclasses

    from graphrun.arguments import add_fields, from_fields

    @dataclasses.dataclass(frozen=True)
    class Params:
        size: int = dataclasses.field(default=3, metadata={"help": "how many", "quiet": True})
        mode: str = dataclasses.field(default="a", metadata={"choices": ("a", "b")})

    parser = argparse.ArgumentParser()
    add_fields(parser, Params)
    assert from_fields(Params, parser.parse_args(["--mode", "b"])) == Params(mode="b")
    help_text = " ".join(parser.format_help().split())
    assert "how many" in help_text and "(default" not in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "c"])
