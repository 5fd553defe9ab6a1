from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphrun.errors import DatasetError
from graphrun.graph import load_dataset, save_dataset
from graphrun.graph.format import load_id_maps
from graphrun.graph.generate import GenParams, community
from graphrun.graph.importers import detect_format, import_graph, load_graph
from graphrun.graph.npy_folder import import_npy_folder


def write_npy_folder(path: Path, **arrays: np.ndarray) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        np.save(path / f"{name}.npy", arr)
    return path


def test_npy_folder_round_trip(tmp_path) -> None:
    g = community(GenParams(nodes=500, avg_degree=6, feat_dim=4, seed=5))
    nd = g.ndata["_N"]
    src_dir = write_npy_folder(
        tmp_path / "raw",
        src=g.src.astype(np.int32),  # any integer dtype is accepted
        dst=g.dst,
        feat=nd["feat"],
        label=nd["label"],
        train_idx=np.flatnonzero(nd["train_mask"]),
        val_idx=np.flatnonzero(nd["val_mask"]),
        test_idx=np.flatnonzero(nd["test_mask"]),
    )
    assert detect_format(src_dir) == "npy"
    h = load_graph(src_dir)
    assert h.num_nodes == g.num_nodes and h.src.dtype == np.int64
    assert (h.src == g.src).all() and (h.dst == g.dst).all()
    for k in ("feat", "label", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(h.ndata["_N"][k], nd[k]), k


def test_npy_num_nodes_from_feat_rows(tmp_path) -> None:
    d = write_npy_folder(
        tmp_path / "raw", src=np.array([0, 1]), dst=np.array([1, 2]), feat=np.ones((5, 2))
    )
    assert import_npy_folder(d).num_nodes == 5
    d2 = write_npy_folder(tmp_path / "raw2", src=np.array([0, 1]), dst=np.array([1, 2]))
    assert import_npy_folder(d2).num_nodes == 3


def test_csv_string_ids_features_and_mapping(tmp_path) -> None:
    (tmp_path / "edges.csv").write_text("src,dst,weight\nann,bob,1.5\nbob,cy,2\ncy,ann,0.5\n")
    (tmp_path / "nodes.csv").write_text(
        "id,feat_0,feat_1,label,train_mask,age\ncy,1.0,2,0,1,30\nbob,3,4,1,0,40\n"
        "ann,5,6,2,0,50\nzed,0,0,0,0,60\n"
    )
    res = import_graph(tmp_path)
    g = res.graph
    assert res.id_maps["_N"].tolist() == ["cy", "bob", "ann", "zed"]  # node-table order
    assert g.num_nodes == 4 and g.num_edges == 3
    ids = res.id_maps["_N"]
    assert [(ids[s], ids[d]) for s, d in zip(g.src, g.dst, strict=True)] == [
        ("ann", "bob"),
        ("bob", "cy"),
        ("cy", "ann"),
    ]
    nd = g.ndata["_N"]
    assert nd["feat"].shape == (4, 2) and nd["feat"].dtype == np.float32
    assert nd["feat"][2].tolist() == [5.0, 6.0]
    assert nd["label"].tolist() == [0, 1, 2, 0]
    assert nd["train_mask"].dtype == bool and nd["train_mask"].tolist() == [1, 0, 0, 0]
    assert nd["age"].dtype == np.int64
    assert g.edata["_N:_E:_N"]["weight"].dtype == np.float32
    # stored with the dataset and read back
    save_dataset(g, tmp_path / "ds", res.id_maps)
    assert load_id_maps(tmp_path / "ds")["_N"].tolist() == ["cy", "bob", "ann", "zed"]
    assert load_graph(tmp_path / "ds").num_edges == 3


def test_csv_sparse_int_ids_without_node_table(tmp_path) -> None:
    (tmp_path / "edges.csv").write_text("src,dst\n900000000000,7\n7,-3\n")
    res = import_graph(tmp_path)
    assert res.id_maps["_N"].tolist() == [-3, 7, 900000000000]  # sorted
    assert res.graph.src.tolist() == [2, 1] and res.graph.dst.tolist() == [1, 0]


def hetero_tables(root: Path, fmt: str) -> None:
    write = (lambda t, p: pq.write_table(t, p)) if fmt == "parquet" else _write_csv
    (root / "edges").mkdir(parents=True)
    (root / "nodes").mkdir()
    write(
        pa.table({"src": ["a1", "a2", "a2"], "dst": [10, 10, 20]}),
        root / "edges" / f"author__writes__paper.{fmt}",
    )
    write(pa.table({"src": [20], "dst": [10]}), root / "edges" / f"paper__cites__paper.{fmt}")
    write(
        pa.table({"id": [20, 10], "label": [1, 0], "x_0": [0.5, 1.5], "x_1": [2.0, 3.0]}),
        root / "nodes" / f"paper.{fmt}",
    )


def _write_csv(table: pa.Table, path: Path) -> None:
    import pyarrow.csv as pacsv

    pacsv.write_csv(table, path)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_hetero_tables_one_file_per_type(tmp_path, fmt) -> None:
    hetero_tables(tmp_path, fmt)
    assert detect_format(tmp_path) == fmt
    res = import_graph(tmp_path)
    g = res.graph
    assert g.node_types == ("paper", "author")
    assert g.edge_types == (("author", "writes", "paper"), ("paper", "cites", "paper"))
    assert res.id_maps["paper"].tolist() == [20, 10]
    assert res.id_maps["author"].tolist() == ["a1", "a2"]
    # author ids come after the 2 papers; paper 10 is dense id 1
    assert g.src.tolist() == [2, 3, 3, 0] and g.dst.tolist() == [1, 1, 0, 1]
    assert g.ndata["paper"]["x"].tolist() == [[0.5, 2.0], [1.5, 3.0]]
    assert g.ndata["paper"]["label"].tolist() == [1, 0]


def test_parquet_etype_column_shared_node_table_and_list_features(tmp_path) -> None:
    pq.write_table(
        pa.table(
            {
                "src": [1, 2, 1],
                "dst": [5, 5, 2],
                "etype": ["user:buys:item", "user:buys:item", "user:follows:user"],
            }
        ),
        tmp_path / "edges.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "id": [1, 2, 5],
                "type": ["user", "user", "item"],
                "emb": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
                "price": [None, None, 9.5],
            }
        ),
        tmp_path / "nodes.parquet",
    )
    g = load_graph(tmp_path)
    assert g.node_types == ("user", "item")
    assert g.edge_types == (("user", "buys", "item"), ("user", "follows", "user"))
    assert g.ndata["user"]["emb"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert "price" not in g.ndata["user"] and g.ndata["item"]["price"].tolist() == [9.5]


def test_single_edges_file(tmp_path) -> None:
    f = tmp_path / "links.csv"
    f.write_text("src,dst\n1,2\n2,3\n")
    assert load_graph(f).num_nodes == 3


def test_dataset_dir_passes_through(tmp_path) -> None:
    g = community(GenParams(nodes=300, avg_degree=4, feat_dim=2))
    save_dataset(g, tmp_path / "ds")
    assert detect_format(tmp_path / "ds") == "dataset"
    h = load_graph(tmp_path / "ds")
    assert (h.src == g.src).all() and (load_dataset(tmp_path / "ds").dst == g.dst).all()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: write_npy_folder(d, src=np.array([0, 1]), dst=np.array([1])), "dst.npy: has 1"),
        (
            lambda d: write_npy_folder(d, src=np.array([0.0]), dst=np.array([1])),
            "src.npy: expected an integer",
        ),
        (
            lambda d: write_npy_folder(d, src=np.array([0, -1]), dst=np.array([1, 1])),
            "src.npy: entry 1 is -1",
        ),
        (
            lambda d: write_npy_folder(
                d, src=np.array([0]), dst=np.array([1]), label=np.array([1.0, 2.0])
            ),
            "label.npy: expected an integer",
        ),
        (
            lambda d: write_npy_folder(
                d, src=np.array([0]), dst=np.array([3]), feat=np.ones((2, 2))
            ),
            "feat.npy: has 2 rows",
        ),
        (
            lambda d: write_npy_folder(
                d, src=np.array([0]), dst=np.array([1]), test_idx=np.array([0, 5])
            ),
            r"test_idx.npy: entry 1 is node 5",
        ),
    ],
)
def test_npy_bad_inputs_name_the_file(tmp_path, setup, message) -> None:
    setup(tmp_path / "raw")
    with pytest.raises(DatasetError, match=message):
        load_graph(tmp_path / "raw")


def test_nothing_importable(tmp_path) -> None:
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DatasetError, match="not a graphrun dataset"):
        load_graph(tmp_path)
    with pytest.raises(DatasetError, match="no such file"):
        load_graph(tmp_path / "nope")
    with pytest.raises(DatasetError, match=r"src\.npy: missing"):
        load_graph(tmp_path, fmt="npy")


def test_parquet_dictionary_encoded_ids(tmp_path) -> None:
    cat = pa.array(["a", "b"]).dictionary_encode()
    pq.write_table(pa.table({"src": cat, "dst": pa.array(["b", "c"])}), tmp_path / "edges.parquet")
    res = import_graph(tmp_path)
    assert res.id_maps["_N"].tolist() == ["a", "b", "c"]
    assert res.graph.src.tolist() == [0, 1] and res.graph.dst.tolist() == [1, 2]


ID = st.one_of(
    st.integers(min_value=-(2**62), max_value=2**62),
    st.text(alphabet="abcxyz_-0123456789", min_size=1, max_size=6).map(lambda s: "n" + s),
)


@settings(max_examples=10, deadline=None)
@given(
    edges=st.lists(st.tuples(ID, ID), min_size=1, max_size=30),
    fmt=st.sampled_from(["csv", "parquet"]),
)
def test_tables_round_trip_any_ids(tmp_path_factory, edges, fmt) -> None:
    """Whatever the ids, mapping dense ids back gives the original edge list."""
    root = tmp_path_factory.mktemp("t")
    as_str = any(isinstance(v, str) for e in edges for v in e)
    col = (lambda vs: [str(v) for v in vs]) if as_str else list
    table = pa.table({"src": col([s for s, _ in edges]), "dst": col([d for _, d in edges])})
    if fmt == "csv":
        _write_csv(table, root / "edges.csv")
    else:
        pq.write_table(table, root / "edges.parquet")
    res = import_graph(root)
    ids = res.id_maps["_N"]
    back = [
        (ids[s].item(), ids[d].item()) for s, d in zip(res.graph.src, res.graph.dst, strict=True)
    ]
    want = [(str(s), str(d)) if as_str else (s, d) for s, d in edges]
    assert back == want
    assert res.graph.num_nodes == len({v for e in want for v in e})
