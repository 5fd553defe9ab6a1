"""Synthetic graphs for tests and benchmarks (vectorised, seeded).

:func:`community_graph` draws a homogeneous directed graph with power-law degrees
and planted communities: every edge picks its source with probability proportional
to a Zipf-like node weight, and its destination from the source's community with
probability ``p_in`` (else from the whole graph), again by weight. Labels are the
community modulo ``num_classes``; features are noisy one-hot community codes; about
``train_fraction`` of the nodes are training nodes. :func:`random_graph` is a
smaller, simpler one (skewed degrees, edges in ``dst`` order, an edge weight ``w``)
for sampling tests. :func:`hetero_graph` builds a small heterograph with two node
types and three edge types; :func:`random_hetero_graph` is its larger preset for
sampling tests.
"""

from __future__ import annotations

import numpy as np

from graphrun.graph import Graph


def _draw(cum: np.ndarray, lo: np.ndarray, hi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices drawn with weight ``diff(cum)`` inside ``[lo, hi)`` (arrays of bounds)."""
    a, b = cum[lo], cum[hi]
    x = a + rng.random(len(lo)) * (b - a)
    idx = np.searchsorted(cum, x, side="right") - 1
    return np.clip(idx, lo, hi - 1)


def community_graph(
    num_nodes: int,
    num_edges: int,
    *,
    num_communities: int = 16,
    p_in: float = 0.8,
    alpha: float = 0.5,
    feat_dim: int = 16,
    num_classes: int = 8,
    train_fraction: float = 0.1,
    seed: int = 0,
    name: str = "community",
) -> Graph:
    rng = np.random.default_rng(seed)
    comm = rng.integers(0, num_communities, num_nodes)
    weight = (rng.permutation(num_nodes) + 1.0) ** -alpha
    # order nodes by community so every community is one contiguous weight range
    order = np.argsort(comm, kind="stable")
    cum = np.zeros(num_nodes + 1)
    np.cumsum(weight[order], out=cum[1:])
    bounds = np.searchsorted(comm[order], np.arange(num_communities + 1))
    src_pos = _draw(cum, np.zeros(num_edges, np.int64), np.full(num_edges, num_nodes), rng)
    c = comm[order][src_pos]
    inside = rng.random(num_edges) < p_in
    lo = np.where(inside, bounds[c], 0)
    hi = np.where(inside, bounds[c + 1], num_nodes)
    dst_pos = _draw(cum, lo, hi, rng)
    src = order[src_pos].astype(np.int64)
    dst = order[dst_pos].astype(np.int64)
    label = (comm % num_classes).astype(np.int64)
    feat = rng.normal(0, 1, (num_nodes, feat_dim)).astype(np.float32)
    feat[np.arange(num_nodes), comm % feat_dim] += 2.0
    r = rng.random(num_nodes)
    ndata: dict[str, np.ndarray] = {
        "feat": feat,
        "label": label,
        "train_mask": r < train_fraction,
        "val_mask": (r >= train_fraction) & (r < 2 * train_fraction),
        "test_mask": (r >= 2 * train_fraction) & (r < 3 * train_fraction),
    }
    return Graph(num_nodes=num_nodes, src=src, dst=dst, ndata={"_N": ndata}, name=name)


def random_graph(
    num_nodes: int = 200, num_edges: int = 3000, feat_dim: int = 8, seed: int = 0
) -> Graph:
    """A homogeneous graph with skewed degrees, ``feat``, ``label`` and ``train_mask``."""
    rng = np.random.default_rng(seed)
    w = (np.arange(num_nodes) + 1.0) ** -0.8
    w /= w.sum()
    src = rng.choice(num_nodes, num_edges, p=w).astype(np.int64)
    dst = rng.choice(num_nodes, num_edges, p=w[::-1]).astype(np.int64)
    order = np.argsort(dst, kind="stable")  # arbitrary but fixed edge order
    src, dst = src[order], dst[order]
    feat = rng.standard_normal((num_nodes, feat_dim)).astype(np.float32)
    label = rng.integers(0, 4, num_nodes).astype(np.int64)
    return Graph(
        num_nodes=num_nodes,
        src=src,
        dst=dst,
        ndata={"_N": {"feat": feat, "label": label, "train_mask": rng.random(num_nodes) < 0.5}},
        edata={"_N:_E:_N": {"w": rng.random(num_edges).astype(np.float32)}},
        name="random",
    )


def hetero_graph(
    num_authors: int = 30,
    num_papers: int = 50,
    seed: int = 0,
    *,
    edge_counts: tuple[int, int, int] | None = None,
    feat_dims: tuple[int, int] = (4, 8),
    mask_and_weight: bool = True,
) -> Graph:
    """Authors write papers, papers cite papers, authors follow authors; with features.

    ``edge_counts`` is (writes, cites, follows), by default ``(3 * num_papers,
    4 * num_papers, 2 * num_authors)``; ``feat_dims`` the author and paper feature
    widths. ``mask_and_weight`` adds a paper ``train_mask`` and a ``weight`` on cites.
    """
    rng = np.random.default_rng(seed)
    na, np_ = num_authors, num_papers
    n_writes, n_cites, n_follows = edge_counts or (3 * np_, 4 * np_, 2 * na)
    writes = (rng.integers(0, na, n_writes), na + rng.integers(0, np_, n_writes))
    cites = (na + rng.integers(0, np_, n_cites), na + rng.integers(0, np_, n_cites))
    follows = (rng.integers(0, na, n_follows), rng.integers(0, na, n_follows))
    rels = [writes, cites, follows]
    src = np.concatenate([r[0] for r in rels]).astype(np.int64)
    dst = np.concatenate([r[1] for r in rels]).astype(np.int64)
    counts = [len(r[0]) for r in rels]
    author_dim, paper_dim = feat_dims
    author = {"feat": rng.standard_normal((na, author_dim)).astype(np.float32)}
    paper: dict[str, np.ndarray] = {
        "feat": rng.standard_normal((np_, paper_dim)).astype(np.float32),
        "label": rng.integers(0, 3, np_).astype(np.int64),
    }
    edata: dict[str, dict[str, np.ndarray]] = {}
    if mask_and_weight:
        paper["train_mask"] = rng.random(np_) < 0.3
        edata["paper:cites:paper"] = {"weight": rng.random(counts[1]).astype(np.float32)}
    return Graph(
        num_nodes=na + np_,
        src=src,
        dst=dst,
        node_types=("author", "paper"),
        edge_types=(
            ("author", "writes", "paper"),
            ("paper", "cites", "paper"),
            ("author", "follows", "author"),
        ),
        node_type_offsets=np.array([0, na, na + np_], dtype=np.int64),
        edge_type_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        ndata={"author": author, "paper": paper},
        edata=edata,
        name="hetero",
    )


def random_hetero_graph(seed: int = 0, feat_dim: int = 8) -> Graph:
    """Authors (60) write papers (100); papers cite papers; authors follow authors."""
    return hetero_graph(
        60,
        100,
        seed,
        edge_counts=(600, 900, 300),
        feat_dims=(feat_dim, feat_dim),
        mask_and_weight=False,
    )
