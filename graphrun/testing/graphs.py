"""Synthetic graphs for tests and benchmarks (vectorised, seeded).

:func:`community_graph` draws a homogeneous directed graph with power-law degrees
and planted communities: every edge picks its source with probability proportional
to a Zipf-like node weight, and its destination from the source's community with
probability ``p_in`` (else from the whole graph), again by weight. Labels are the
community modulo ``num_classes``; features are noisy one-hot community codes; about
``train_fraction`` of the nodes are training nodes. :func:`hetero_graph` builds a
small heterograph with two node types and three edge types.
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


def hetero_graph(num_authors: int = 30, num_papers: int = 50, seed: int = 0) -> Graph:
    """Authors write papers, papers cite papers, authors follow authors; with features."""
    rng = np.random.default_rng(seed)
    na, np_ = num_authors, num_papers
    writes = (rng.integers(0, na, 3 * np_), na + rng.integers(0, np_, 3 * np_))
    cites = (na + rng.integers(0, np_, 4 * np_), na + rng.integers(0, np_, 4 * np_))
    follows = (rng.integers(0, na, 2 * na), rng.integers(0, na, 2 * na))
    rels = [writes, cites, follows]
    src = np.concatenate([r[0] for r in rels]).astype(np.int64)
    dst = np.concatenate([r[1] for r in rels]).astype(np.int64)
    counts = [len(r[0]) for r in rels]
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
        ndata={
            "author": {"feat": rng.normal(size=(na, 4)).astype(np.float32)},
            "paper": {
                "feat": rng.normal(size=(np_, 8)).astype(np.float32),
                "label": rng.integers(0, 3, np_).astype(np.int64),
                "train_mask": rng.random(np_) < 0.3,
            },
        },
        edata={
            "paper:cites:paper": {"weight": rng.random(counts[1]).astype(np.float32)},
        },
        name="hetero",
    )
