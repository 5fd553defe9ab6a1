"""Reading node and edge tables for ``graphrun ingest``: bounded chunks, typed, each
checked whole, and one line naming the file and row for each bad one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphrun.errors import ArgumentError, DatasetError
from graphrun.graph import ingest_tables
from graphrun.graph.ingest_tables import (
    EdgeChunk,
    NodeChunk,
    detect,
    plan_sources,
    read_chunks,
)


def chunks(root, rows=3, fmt=None):
    return list(read_chunks(plan_sources(root, fmt), rows))


@pytest.fixture
def csv_dir(tmp_path):
    lines = ["id,label,feat_0,feat_1,train_mask"]
    lines += [f"{100 + i},{i % 3},{i}.5,{-i},{i % 2}" for i in range(7)]
    (tmp_path / "nodes.csv").write_text("\n".join(lines) + "\n")
    edges = ["src,dst,w"] + [f"{100 + i},{7 + i},{i}" for i in range(5)]
    (tmp_path / "edges.csv").write_text("\n".join(edges) + "\n")
    return tmp_path


def test_csv_in_chunks_nodes_first(csv_dir):
    got = chunks(csv_dir)
    assert [type(c).__name__ for c in got] == ["NodeChunk"] * 3 + ["EdgeChunk"] * 2
    nodes = [c for c in got if isinstance(c, NodeChunk)]
    assert [c.rows.tolist() for c in nodes] == [[0, 1, 2], [3, 4, 5], [6]]
    assert np.concatenate([c.ids for c in nodes]).tolist() == list(range(100, 107))
    first = nodes[0]
    assert first.ntype == "_N" and first.ids.dtype == np.int64
    assert sorted(first.features) == ["feat", "label", "train_mask"]
    assert first.features["feat"].dtype == np.float32
    assert first.features["feat"].tolist() == [[0.5, 0], [1.5, -1], [2.5, -2]]
    assert first.features["label"].dtype == np.int64
    assert first.features["train_mask"].tolist() == [False, True, False]
    edge = got[3]
    assert isinstance(edge, EdgeChunk) and edge.etype == ("_N", "_E", "_N")
    assert edge.src.tolist() == [100, 101, 102] and edge.dst.tolist() == [7, 8, 9]
    assert edge.features["w"].tolist() == [0, 1, 2]
    assert edge.where() == f"{csv_dir / 'edges.csv'}: rows 0..2"


def test_chunks_span_csv_blocks(csv_dir, monkeypatch):
    monkeypatch.setattr(ingest_tables, "CSV_BLOCK_BYTES", 40)  # a few rows a block
    got = chunks(csv_dir, rows=4)
    assert [c.rows.tolist() for c in got] == [[0, 1, 2, 3], [4, 5, 6], [0, 1, 2, 3], [4]]


def test_parquet_split_by_type_keeps_file_rows(tmp_path):
    nodes = pa.table(
        {"id": [1, 2, 3, 4], "type": ["paper", "author", "paper", "author"], "x": [0.0, 1, 2, 3]}
    )
    pq.write_table(nodes, tmp_path / "nodes.parquet")
    (tmp_path / "edges").mkdir()
    edges = pa.table({"src": [2, 4], "dst": [1, 3], "h": [[1.0, 2.0], [3.0, 4.0]]})
    pq.write_table(edges, tmp_path / "edges" / "author__writes__paper.parquet")
    got = chunks(tmp_path, rows=10)
    assert [(c.ntype, c.rows.tolist(), c.ids.tolist()) for c in got[:2]] == [
        ("paper", [0, 2], [1, 3]),
        ("author", [1, 3], [2, 4]),
    ]
    assert got[2].etype == ("author", "writes", "paper")
    assert got[2].features["h"].shape == (2, 2)


def test_etype_column_triple_or_relation(tmp_path):
    (tmp_path / "edges.csv").write_text("src,dst,etype\n1,2,a:r:b\n3,4,cites\n5,6,a:r:b\n")
    got = chunks(tmp_path, rows=10)
    assert [(c.etype, c.rows.tolist()) for c in got] == [(("a", "r", "b"), [0, 2]), ("cites", [1])]
    alone = chunks(tmp_path / "edges.csv", rows=10)  # SRC may be one edges file
    assert [c.src.tolist() for c in alone] == [[1, 5], [3]]


def test_npy_folder(tmp_path):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "edges").mkdir()
    np.save(tmp_path / "nodes" / "id.npy", np.arange(50, 55, dtype=np.int32))
    np.save(tmp_path / "nodes" / "feat.npy", np.ones((5, 4)))
    np.save(tmp_path / "nodes" / "label.npy", np.arange(5, dtype=np.int16))
    np.save(tmp_path / "edges" / "src.npy", np.array([50, 51]))
    np.save(tmp_path / "edges" / "dst.npy", np.array([1, 2]))
    assert detect(tmp_path) == "npy"
    got = chunks(tmp_path, rows=2)
    assert [len(c.rows) for c in got] == [2, 2, 1, 2]
    n = got[0]
    assert isinstance(n, NodeChunk) and n.ids.tolist() == [50, 51]
    assert n.features["feat"].dtype == np.float32 and n.features["feat"].shape == (2, 4)
    assert n.features["label"].dtype == np.int64
    assert got[3].src.tolist() == [50, 51] and got[3].features == {}


def bad_lines(root, rows=3, fmt=None):
    """The chunks read before the error, and the error's line."""
    good = []
    with pytest.raises(DatasetError) as info:
        for c in read_chunks(plan_sources(root, fmt), rows):
            good.append(c)
    return good, str(info.value)


def test_an_empty_id_names_file_and_row(csv_dir):
    text = (csv_dir / "nodes.csv").read_text().replace("\n104,", "\n,")
    (csv_dir / "nodes.csv").write_text(text)
    good, line = bad_lines(csv_dir)
    assert len(good) == 1  # the chunk before; nothing of the bad one
    assert line == f"{csv_dir / 'nodes.csv'}: column 'id' is empty in row 4"


def test_a_repeated_id_and_a_bad_feature_are_named(csv_dir):
    text = (csv_dir / "nodes.csv").read_text().replace("\n105,", "\n103,")
    (csv_dir / "nodes.csv").write_text(text)
    _, line = bad_lines(csv_dir)
    assert line == f"{csv_dir / 'nodes.csv'}: id 103 appears twice (rows 3 and 5)"
    (csv_dir / "edges.csv").write_text("src,dst,w\n1,2,x\n")
    (csv_dir / "nodes.csv").unlink()
    _, line = bad_lines(csv_dir)
    assert "edges.csv: column 'w' has type string; feature columns must be numeric" in line


def test_a_type_change_after_the_first_block_names_the_row(csv_dir, monkeypatch):
    monkeypatch.setattr(ingest_tables, "CSV_BLOCK_BYTES", 40)
    text = (csv_dir / "edges.csv").read_text().replace("\n103,", "\n10x3,")
    (csv_dir / "edges.csv").write_text(text)
    good, line = bad_lines(csv_dir, rows=2)
    assert line.startswith(f"{csv_dir / 'edges.csv'}: after row ")
    assert "10x3" in line
    assert sum(len(c.rows) for c in good if isinstance(c, EdgeChunk)) <= 3


def test_string_ids_are_refused(tmp_path):
    (tmp_path / "edges.csv").write_text("src,dst\na,b\n")
    _, line = bad_lines(tmp_path)
    assert line.endswith("column 'src' has type string; ingest takes integer original ids")


def test_layout_checked_before_any_row(tmp_path):
    (tmp_path / "edges.csv").write_text("from,dst\n1,2\n")
    with pytest.raises(DatasetError, match=r"edges.csv: column 'src' is missing"):
        plan_sources(tmp_path)
    (tmp_path / "edges.csv").unlink()
    with pytest.raises(DatasetError, match="holds no node or edge tables"):
        plan_sources(tmp_path)
    (tmp_path / "nodes.csv").write_text("id\n1\n")
    pq.write_table(pa.table({"src": [1], "dst": [2]}), tmp_path / "edges.parquet")
    with pytest.raises(DatasetError, match=r"several formats of \(csv, parquet\)"):
        plan_sources(tmp_path)
    with pytest.raises(DatasetError, match="no such file or directory"):
        plan_sources(tmp_path / "nope")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "edges").mkdir()
    (tmp_path / "bad" / "edges" / "a__b.csv").write_text("src,dst\n")
    with pytest.raises(DatasetError, match="SRCTYPE__RELATION__DSTTYPE"):
        plan_sources(tmp_path / "bad")


def test_npy_rows_and_dtypes_checked(tmp_path):
    (tmp_path / "nodes").mkdir()
    np.save(tmp_path / "nodes" / "id.npy", np.arange(5))
    np.save(tmp_path / "nodes" / "feat.npy", np.ones((4, 2)))
    with pytest.raises(DatasetError, match=r"feat.npy: has 4 rows, id.npy has 5"):
        plan_sources(tmp_path)
    np.save(tmp_path / "nodes" / "feat.npy", np.ones(5))
    np.save(tmp_path / "nodes" / "id.npy", np.arange(5.0))
    with pytest.raises(DatasetError, match=r"id.npy: expected 1-d integer ids, got float64"):
        plan_sources(tmp_path)


def test_bounds(csv_dir, monkeypatch):
    with pytest.raises(ArgumentError, match=r"chunk_rows: 0 is not in \[1, 2097152\]"):
        chunks(csv_dir, rows=0)
    monkeypatch.setattr(ingest_tables, "MAX_CHUNK_BYTES", 64)
    _, line = bad_lines(csv_dir, rows=3)
    assert line.startswith(f"{csv_dir / 'nodes.csv'}: rows 0..2: ")
    assert "over the bound of 64 a chunk; give a smaller --chunk-rows" in line
