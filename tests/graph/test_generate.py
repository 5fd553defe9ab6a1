import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.graph.generate import GenParams, academic, community


@pytest.fixture(scope="module")
def comm():
    return community(GenParams(nodes=20_000, avg_degree=20, classes=8, feat_dim=16, seed=3))


def test_community_sizes_and_symmetry(comm) -> None:
    g = comm
    assert g.num_nodes == 20_000
    assert g.num_edges == 20_000 * 20
    assert not (g.src == g.dst).any(), "no self loops"
    keys = g.src * g.num_nodes + g.dst
    assert len(np.unique(keys)) == g.num_edges, "no duplicate edges"
    rev = np.sort(g.dst * g.num_nodes + g.src)
    assert (np.sort(keys) == rev).all(), "every edge is stored both ways"


def test_community_degrees_are_heavy_tailed(comm) -> None:
    deg = comm.in_degrees()
    mean = deg.mean()
    assert deg.max() > 10 * mean
    # a Poisson(20) graph has essentially no node above 5x the mean; a power law has many
    assert (deg > 5 * mean).mean() > 0.005
    assert np.median(deg) < mean  # skewed to the right


def test_community_labels_masks_features(comm) -> None:
    nd = comm.ndata["_N"]
    label = nd["label"]
    assert label.dtype == np.int64 and set(np.unique(label)) == set(range(8))
    same = (label[comm.src] == label[comm.dst]).mean()
    assert 0.75 < same < 0.9  # homophily 0.8 plus chance
    masks = np.stack([nd["train_mask"], nd["val_mask"], nd["test_mask"]])
    assert masks.dtype == bool and masks.sum(axis=0).max() == 1, "splits are disjoint"
    assert masks.sum(axis=1).tolist() == [2000, 2000, 4000]
    feat = nd["feat"]
    assert feat.shape == (20_000, 16) and feat.dtype == np.float32
    # features carry the label: the class means are far apart relative to their error
    centroids = np.stack([feat[label == c].mean(0) for c in range(8)])
    nearest = np.argmin(((centroids[:, None] - centroids[None]) ** 2).sum(-1) + 1e9 * np.eye(8), 1)
    assert (nearest != np.arange(8)).all()
    assert np.abs(centroids).mean() > 0.5


def test_generation_is_deterministic() -> None:
    p = GenParams(nodes=3000, avg_degree=10, feat_dim=4, seed=11)
    a, b = community(p), community(p)
    assert (a.src == b.src).all() and (a.dst == b.dst).all()
    for k in a.ndata["_N"]:
        assert (a.ndata["_N"][k] == b.ndata["_N"][k]).all()
    c = community(GenParams(nodes=3000, avg_degree=10, feat_dim=4, seed=12))
    assert not np.array_equal(a.src, c.src)
    h1, h2 = academic(p), academic(p)
    assert (h1.src == h2.src).all() and (
        h1.ndata["paper"]["feat"] == h2.ndata["paper"]["feat"]
    ).all()


def test_academic_structure() -> None:
    g = academic(GenParams(nodes=5000, avg_degree=10, classes=5, feat_dim=8, seed=1))
    assert g.node_types == ("paper", "author", "institution", "field")
    rels = [e[1] for e in g.edge_types]
    assert rels[:4] == ["writes", "cites", "affiliated_with", "has_topic"]
    assert rels[4:] == ["rev_writes", "rev_cites", "rev_affiliated_with", "rev_has_topic"]
    assert abs(g.num_edges - 5000 * 10) < 0.05 * 5000 * 10
    assert g.num_edges_of("author:affiliated_with:institution") == g.num_nodes_of("author")
    for s, r, d in g.edge_types[:4]:
        assert g.num_edges_of((s, r, d)) == g.num_edges_of((d, f"rev_{r}", s))
    eto = g.edge_type_offsets
    cites = slice(int(eto[1]), int(eto[2]))
    assert (g.src[cites] > g.dst[cites]).all(), "papers cite older (smaller id) papers"
    paper = g.ndata["paper"]
    assert set(paper) == {"feat", "label", "train_mask", "val_mask", "test_mask"}
    assert len(paper["label"]) == g.num_nodes_of("paper")
    assert all(g.ndata[t]["feat"].shape[1] == 8 for t in g.node_types)
    # citations are homophilous: cited papers mostly share the citing paper's label
    lab = paper["label"]
    assert (lab[g.src[cites]] == lab[g.dst[cites]]).mean() > 0.7


def test_academic_without_reverse() -> None:
    g = academic(GenParams(nodes=500, avg_degree=6, seed=2), reverse=False)
    assert len(g.edge_types) == 4


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"nodes": 1}, "--nodes"),
        ({"avg_degree": 0}, "--avg-degree"),
        ({"nodes": 10, "avg_degree": 20}, "--avg-degree"),
        ({"homophily": 1.5}, "--homophily"),
        ({"classes": 0}, "--classes"),
        ({"exponent": 1.5}, "--exponent"),
        ({"train_frac": 0.8, "test_frac": 0.5}, "--train-frac"),
    ],
)
def test_bad_parameters_name_the_flag(kwargs, flag) -> None:
    with pytest.raises(ArgumentError, match=flag):
        community(GenParams(**kwargs))


def test_neighbours_carry_the_label_signal() -> None:
    """The property the GraphSAGE-vs-MLP benchmark shows, with a nearest-centroid model:
    averaging a node's neighbourhood classifies far better than its own features."""
    g = community(GenParams(nodes=5000, avg_degree=20, seed=4))
    nd = g.ndata["_N"]
    x, y, train, test = nd["feat"], nd["label"], nd["train_mask"], nd["test_mask"]
    deg = np.bincount(g.dst, minlength=g.num_nodes)[:, None]
    agg = np.zeros_like(x)
    np.add.at(agg, g.dst, x[g.src])
    hood = (x + agg) / (1 + deg)

    def accuracy(feat: np.ndarray) -> float:
        cent = np.stack([feat[train & (y == c)].mean(0) for c in range(10)])
        pred = np.argmin(((feat[test][:, None] - cent[None]) ** 2).sum(-1), 1)
        return float((pred == y[test]).mean())

    own, neigh = accuracy(x), accuracy(hood)
    assert own < 0.85
    assert neigh > own + 0.15
