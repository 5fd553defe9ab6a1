import numpy as np
import pytest

from graphrun.errors import DatasetError
from graphrun.graph import Graph, load_dataset, save_dataset


def hetero() -> Graph:
    # 3 authors (0..2), 2 papers (3..4)
    return Graph(
        num_nodes=5,
        src=np.array([0, 1, 2, 3], dtype=np.int64),
        dst=np.array([3, 3, 4, 4], dtype=np.int64),
        node_types=("author", "paper"),
        edge_types=(("author", "writes", "paper"), ("paper", "cites", "paper")),
        node_type_offsets=np.array([0, 3, 5], dtype=np.int64),
        edge_type_offsets=np.array([0, 3, 4], dtype=np.int64),
        ndata={"paper": {"feat": np.ones((2, 4), np.float32), "label": np.array([0, 1])}},
        edata={"paper:cites:paper": {"w": np.array([0.5], np.float32)}},
        name="tiny",
    )


def test_types_are_derived() -> None:
    g = hetero()
    assert g.is_hetero
    assert g.node_type_ids().tolist() == [0, 0, 0, 1, 1]
    assert g.node_per_type_ids().tolist() == [0, 1, 2, 0, 1]
    assert g.edge_type_ids().tolist() == [0, 0, 0, 1]
    assert g.edge_per_type_ids().tolist() == [0, 1, 2, 0]
    assert g.num_nodes_of("paper") == 2
    assert g.num_edges_of("author:writes:paper") == 3


def test_csc_groups_in_edges() -> None:
    g = hetero()
    indptr, indices, eids = g.csc()
    assert indptr.tolist() == [0, 0, 0, 0, 2, 4]
    assert sorted(indices[indptr[3] : indptr[4]].tolist()) == [0, 1]
    assert (g.src[eids] == indices).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"src": np.array([0, 1, 2, 9], dtype=np.int64)}, r"src\[3\] = 9 is out of range"),
        ({"dst": np.array([3, 3, 4], dtype=np.int64)}, "different lengths"),
        ({"src": np.array([0, 1, 2, 3], dtype=np.int32)}, "src: expected dtype int64"),
        ({"src": np.array([0, 1, 3, 3], dtype=np.int64)}, r"src\[2\] = 3 is not a 'author' node"),
        ({"ndata": {"paper": {"feat": np.ones((3, 4))}}}, r"ndata\['paper'\]\['feat'\]"),
        (
            {"ndata": {"paper": {"feat": np.array([[0.0, 1], [np.nan, 2]])}}},
            r"\['feat'\]: 1 NaN or infinite values \(first in row 1\)",
        ),
        (
            {"ndata": {"paper": {"feat": np.array([[np.inf], [-np.inf]], np.float32)}}},
            "2 NaN or infinite values",
        ),
        ({"ndata": {"paper": {"feat": np.ones((2, 2), np.complex64)}}}, "complex values"),
    ],
)
def test_validation_names_the_array(change: dict, message: str) -> None:
    g = hetero()
    kwargs = {k: getattr(g, k) for k in g.__dataclass_fields__}
    kwargs.update(change)
    with pytest.raises(DatasetError, match=message):
        Graph(**kwargs)


def test_dataset_round_trip(tmp_path) -> None:
    g = hetero()
    save_dataset(g, tmp_path / "ds")
    h = load_dataset(tmp_path / "ds")
    assert h.node_types == g.node_types and h.edge_types == g.edge_types
    assert (h.src == g.src).all() and (h.dst == g.dst).all()
    assert (h.ndata["paper"]["feat"] == 1).all()
    assert h.edata["paper:cites:paper"]["w"].tolist() == [0.5]
    assert not list(tmp_path.glob(".*tmp*"))


def test_load_rejects_other_version(tmp_path) -> None:
    save_dataset(hetero(), tmp_path / "ds")
    meta = tmp_path / "ds" / "graph.json"
    meta.write_text(meta.read_text().replace('"version": 1', '"version": 7'))
    with pytest.raises(DatasetError, match="field 'version' is 7"):
        load_dataset(tmp_path / "ds")
