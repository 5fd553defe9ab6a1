"""Small random graphs for sampling and dist tests (deterministic under a seed)."""

from __future__ import annotations

import numpy as np

from graphrun.graph.graph import Graph


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


def random_hetero_graph(seed: int = 0, feat_dim: int = 8) -> Graph:
    """Authors (60) write papers (100); papers cite papers; authors follow authors."""
    rng = np.random.default_rng(seed)
    na, np_ = 60, 100
    writes = (rng.integers(0, na, 600), na + rng.integers(0, np_, 600))
    cites = (na + rng.integers(0, np_, 900), na + rng.integers(0, np_, 900))
    follows = (rng.integers(0, na, 300), rng.integers(0, na, 300))
    src = np.concatenate([writes[0], cites[0], follows[0]]).astype(np.int64)
    dst = np.concatenate([writes[1], cites[1], follows[1]]).astype(np.int64)
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
        edge_type_offsets=np.array([0, 600, 1500, 1800], dtype=np.int64),
        ndata={
            "author": {"feat": rng.standard_normal((na, feat_dim)).astype(np.float32)},
            "paper": {
                "feat": rng.standard_normal((np_, feat_dim)).astype(np.float32),
                "label": rng.integers(0, 3, np_).astype(np.int64),
            },
        },
        name="hetero",
    )
