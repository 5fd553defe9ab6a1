"""Helpers of graphrun.graph.format shared by every writer."""

import json
from pathlib import Path

import pytest

from graphrun.files import write_atomic


def test_write_text_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "ready.json"
    target.write_text("old\n")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]


def test_write_text_atomic_cleans_up_on_failure(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing-dir" / "x.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_graph_json_keeps_its_bytes(tmp_path: Path) -> None:
    """The declared GraphMeta writes what the hand-written dict wrote: same keys, same
    order, same indent (datasets written before still load, and look the same)."""
    from graphrun.graph import save_dataset
    from graphrun.testing.graphs import hetero_graph

    g = hetero_graph(3, 4, edge_counts=(2, 2, 1))
    save_dataset(g, tmp_path / "ds")
    meta = {
        "format": "graphrun-dataset",
        "version": 1,
        "name": g.name,
        "num_nodes": int(g.num_nodes),
        "num_edges": int(g.num_edges),
        "node_types": [{"name": t, "count": g.num_nodes_of(t)} for t in g.node_types],
        "edge_types": [
            {"src": e[0], "rel": e[1], "dst": e[2], "count": g.num_edges_of(e)}
            for e in g.edge_types
        ],
        "node_features": {
            t: {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in f.items()}
            for t, f in g.ndata.items()
            if f
        },
        "edge_features": {
            t: {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in f.items()}
            for t, f in g.edata.items()
            if f
        },
        "id_maps": {},
    }
    assert (tmp_path / "ds" / "graph.json").read_text() == json.dumps(meta, indent=2) + "\n"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["node_types"][0].update(count="x"), "node_types[0].count: Expected `int`"),
        (lambda m: m["node_types"][0].update(count=-1), "node_types[0]: count: must be >= 0"),
        (lambda m: m.pop("num_edges"), "num_edges: missing"),
        (lambda m: m.update(node_features={"paper": {"f": {"dtype": 1}}}), "node_features"),
    ],
)
def test_a_bad_graph_json_is_one_line_naming_the_field(tmp_path: Path, edit, message) -> None:
    from graphrun.errors import DatasetError
    from graphrun.graph import load_dataset, save_dataset
    from graphrun.testing.graphs import hetero_graph

    save_dataset(hetero_graph(3, 4, edge_counts=(2, 2, 1)), tmp_path / "ds")
    path = tmp_path / "ds" / "graph.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(DatasetError) as info:
        load_dataset(tmp_path / "ds")
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    assert "\n" not in str(info.value)
