"""Synthetic datasets: a homogeneous community graph and a heterogeneous academic graph.

Both are degree-corrected stochastic block models (:mod:`graphrun.graph.sbm`):
every node draws a power-law degree propensity, and an edge stays inside its
community with probability ``homophily``. Everything is vectorised numpy and
generated in fixed-size chunks, so the output depends only on the parameters and
the seed, and 2M nodes / 80M edges fit in a few GB.

``community`` (:func:`community`)
    One node type. ``label`` = community; ``feat`` = the community's centroid
    (a standard-normal vector) plus Gaussian noise of std ``feat_noise``. The noise
    is large enough that a model reading one node's features (an MLP) is much
    worse than one that also averages its neighbours (GraphSAGE): see
    ``benchmarks/README.md`` for the measured gap. Edges are undirected, stored in
    both directions, no self loops, no duplicates: ``num_edges = nodes * avg_degree``
    (rounded to even).

``academic`` (:func:`academic`)
    Node types, in global id order: ``paper`` (50%), ``author`` (38%),
    ``institution`` (2%), ``field`` (10%). Relations::

        author  writes          paper         authors mostly write papers of their field
        paper   cites           paper         citing id > cited id (ids are in time order)
        author  affiliated_with institution   one per author
        paper   has_topic       field         mostly fields of the paper's class

    and, unless ``reverse=False``, their reverses ``paper rev_writes author``,
    ``paper rev_cites paper``, ``institution rev_affiliated_with author``,
    ``field rev_has_topic paper`` — PyG's ``ToUndirected`` naming — so that a
    heterogeneous GNN passes messages both ways (papers hear from their fields and
    citers, authors from their institutions). The task is paper classification:
    ``paper`` has ``label`` and masks; every type has ``feat`` (papers and authors:
    noisy class centroids; fields: nearly clean centroids; institutions: noise).
    ``num_edges ≈ nodes * avg_degree`` counting reverses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from graphrun.errors import ArgumentError
from graphrun.graph.graph import Graph
from graphrun.graph.sbm import BlockSampler, power_law_weights, undirected_pairs

FEAT_CHUNK_ROWS = 1 << 16


@dataclass(frozen=True)
class GenParams:
    """Parameters shared by both generators. They are the CLI's flags too
    (:func:`graphrun.arguments.add_fields`: ``feat_dim`` is ``--feat-dim``, its help the
    field's ``help``); :meth:`validate` checks them, naming the flag."""

    nodes: int = field(default=10_000, metadata={"help": "number of nodes"})
    avg_degree: float = field(
        default=20.0, metadata={"help": "edges per node, counting both directions"}
    )
    classes: int = field(default=10, metadata={"help": "communities = label classes"})
    feat_dim: int = field(default=64, metadata={"help": "node feature width"})
    homophily: float = field(default=0.8, metadata={"help": "fraction of edges inside a community"})
    feat_noise: float = field(
        default=4.0, metadata={"help": "std of the feature noise around unit centroids"}
    )
    exponent: float = field(
        default=2.5, metadata={"help": "power-law exponent of the degree distribution"}
    )
    train_frac: float = field(
        default=0.1, metadata={"help": "share of (labelled) nodes in train_mask"}
    )
    val_frac: float = field(default=0.1, metadata={"help": "share in val_mask"})
    test_frac: float = field(default=0.2, metadata={"help": "share in test_mask"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    name: str = field(default="", metadata={"help": "dataset name", "shown": "the kind"})

    def validate(self) -> None:
        def bad(flag: str, msg: str) -> ArgumentError:
            return ArgumentError(f"--{flag}: {msg}")

        if self.nodes < 2:
            raise bad("nodes", f"must be at least 2, got {self.nodes}")
        if not 0 < self.avg_degree < math.inf:
            raise bad("avg-degree", f"must be positive, got {self.avg_degree}")
        if self.avg_degree > self.nodes - 1:
            raise bad("avg-degree", f"{self.avg_degree} is more than nodes-1 ({self.nodes - 1})")
        if not 1 <= self.classes <= self.nodes:
            raise bad("classes", f"must be in [1, nodes], got {self.classes}")
        if self.feat_dim < 1:
            raise bad("feat-dim", f"must be at least 1, got {self.feat_dim}")
        if not 0.0 <= self.homophily <= 1.0:
            raise bad("homophily", f"must be in [0, 1], got {self.homophily}")
        if not self.feat_noise >= 0 or not math.isfinite(self.feat_noise):
            raise bad("feat-noise", f"must be finite and non-negative, got {self.feat_noise}")
        if not 2.0 < self.exponent < math.inf:
            raise bad("exponent", f"must be > 2 (finite mean degree), got {self.exponent}")
        fracs = {"train-frac": self.train_frac, "val-frac": self.val_frac,
                 "test-frac": self.test_frac}  # fmt: skip
        for flag, frac in fracs.items():
            if not 0.0 <= frac <= 1.0:  # NaN fails too
                raise bad(flag, f"must be a fraction in [0, 1], got {frac}")
        if sum(fracs.values()) > 1.0 + 1e-9:
            raise bad("train-frac", f"train/val/test fractions {tuple(fracs.values())} sum > 1")
        if not 0 <= self.seed < 2**63:
            raise bad("seed", f"must be a non-negative integer, got {self.seed}")


def split_masks(n: int, params: GenParams, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Disjoint random ``train_mask``/``val_mask``/``test_mask`` over ``n`` nodes."""
    perm = rng.permutation(n)
    out: dict[str, np.ndarray] = {}
    start = 0
    for name, frac in (
        ("train", params.train_frac),
        ("val", params.val_frac),
        ("test", params.test_frac),
    ):
        k = round(frac * n)
        mask = np.zeros(n, dtype=bool)
        mask[perm[start : start + k]] = True
        out[f"{name}_mask"] = mask
        start += k
    return out


def noisy_centroids(
    labels: np.ndarray | None,
    centroids: np.ndarray,
    noise: float,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``centroids[labels] + N(0, noise²)`` as float32, built in row chunks."""
    out = np.empty((n, centroids.shape[1]), dtype=np.float32)
    for a in range(0, n, FEAT_CHUNK_ROWS):
        b = min(n, a + FEAT_CHUNK_ROWS)
        chunk = out[a:b]
        rng.standard_normal(out=chunk, dtype=np.float32)
        chunk *= np.float32(noise)
        if labels is not None:
            chunk += centroids[labels[a:b]]
    return out


def community(params: GenParams) -> Graph:
    """The homogeneous community graph (see the module docstring)."""
    params.validate()
    rng = np.random.default_rng(params.seed)
    n, c = params.nodes, params.classes
    labels = rng.integers(0, c, size=n, dtype=np.int64)
    theta = power_law_weights(n, params.exponent, rng)
    sampler = BlockSampler.build(labels, theta, c)
    del theta
    pairs = round(n * params.avg_degree / 2)
    u, v = undirected_pairs(
        sampler, sampler, labels, pairs, params.homophily, rng, n, canonical=True
    )
    del sampler
    src = np.concatenate([u, v])
    dst = np.concatenate([v, u])
    del u, v
    centroids = rng.standard_normal((c, params.feat_dim), dtype=np.float32)
    feat = noisy_centroids(labels, centroids, params.feat_noise, n, rng)
    ndata = {"feat": feat, "label": labels, **split_masks(n, params, rng)}
    return Graph(
        num_nodes=n, src=src, dst=dst, ndata={"_N": ndata}, name=params.name or "community"
    )


ACADEMIC_SHARES = (("paper", 0.50), ("author", 0.38), ("institution", 0.02), ("field", 0.10))
FORWARD = (
    ("author", "writes", "paper"),
    ("paper", "cites", "paper"),
    ("author", "affiliated_with", "institution"),
    ("paper", "has_topic", "field"),
)


def _type_counts(n: int) -> dict[str, int]:
    counts = {t: max(1, int(n * share)) for t, share in ACADEMIC_SHARES}
    counts["paper"] += n - sum(counts.values())
    if counts["paper"] < 1:
        raise ArgumentError(f"--nodes: {n} is too small for an academic graph (need >= 8)")
    return counts


@dataclass(frozen=True, eq=False)
class _Typed:
    """Per node type: count, global id offset, block (class) of every node, sampler."""

    counts: dict[str, int]
    offsets: dict[str, int]
    blocks: dict[str, np.ndarray]
    samplers: dict[str, BlockSampler]


def _academic_edges(
    params: GenParams, nt: _Typed, reverse: bool, rng: np.random.Generator
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Global ``(src, dst)`` of each forward relation, keyed by relation name."""
    n_paper, n_author = nt.counts["paper"], nt.counts["author"]
    forward_budget = params.nodes * params.avg_degree / (2 if reverse else 1)
    rest = max(forward_budget - n_author, 3.0 * n_paper)
    shares = {"writes": 0.35, "cites": 0.5, "has_topic": 0.15}
    sizes = {k: round(min(v * rest, _max_pairs(k, nt.counts))) for k, v in shares.items()}

    def pairs(a: str, b: str, m: int, canonical: bool) -> tuple[np.ndarray, np.ndarray]:
        return undirected_pairs(
            nt.samplers[a],
            nt.samplers[b],
            nt.blocks[a],
            m,
            params.homophily,
            rng,
            nt.counts[b],
            canonical=canonical,
            offset_src=nt.offsets[a],
            offset_dst=nt.offsets[b],
        )

    edges: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    p, a = pairs("paper", "author", sizes["writes"], False)
    edges["writes"] = (a, p)
    older, newer = pairs("paper", "paper", sizes["cites"], True)
    edges["cites"] = (newer, older)
    inst_sampler, author_blocks = nt.samplers["institution"], nt.blocks["author"]
    inst = np.empty(n_author, dtype=np.int64)
    inside = (rng.random(n_author) < params.homophily) & inst_sampler.nonempty(author_blocks)
    inst[inside] = inst_sampler.draw_in(author_blocks[inside], rng)
    inst[~inside] = inst_sampler.draw_global(int((~inside).sum()), rng)
    edges["affiliated_with"] = (
        np.arange(n_author, dtype=np.int64) + nt.offsets["author"],
        inst + nt.offsets["institution"],
    )
    edges["has_topic"] = pairs("paper", "field", sizes["has_topic"], False)
    return edges


def _academic_features(
    params: GenParams, nt: _Typed, rng: np.random.Generator
) -> dict[str, dict[str, np.ndarray]]:
    centroids = rng.standard_normal((params.classes, params.feat_dim), dtype=np.float32)
    noise = {
        "paper": params.feat_noise,
        "author": params.feat_noise,
        "institution": 1.0,
        "field": 0.1,
    }
    ndata = {}
    for t, n in nt.counts.items():
        labels = None if t == "institution" else nt.blocks[t]
        ndata[t] = {"feat": noisy_centroids(labels, centroids, noise[t], n, rng)}
    ndata["paper"]["label"] = nt.blocks["paper"]
    ndata["paper"].update(split_masks(nt.counts["paper"], params, rng))
    return ndata


def academic(params: GenParams, reverse: bool = True) -> Graph:
    """The heterogeneous academic graph (see the module docstring)."""
    params.validate()
    if params.nodes < 8:
        raise ArgumentError(f"--nodes: {params.nodes} is too small for an academic graph")
    rng = np.random.default_rng(params.seed)
    counts = _type_counts(params.nodes)
    node_offsets = np.concatenate([[0], np.cumsum(list(counts.values()))]).astype(np.int64)
    blocks = {t: rng.integers(0, params.classes, size=counts[t], dtype=np.int64) for t in counts}
    nt = _Typed(
        counts=counts,
        offsets={t: int(o) for t, o in zip(counts, node_offsets[:-1], strict=True)},
        blocks=blocks,
        samplers={
            t: BlockSampler.build(
                blocks[t], power_law_weights(counts[t], params.exponent, rng), params.classes
            )
            for t in counts
        },
    )
    edges = _academic_edges(params, nt, reverse, rng)
    etypes = list(FORWARD)
    srcs = [edges[r][0] for _, r, _ in FORWARD]
    dsts = [edges[r][1] for _, r, _ in FORWARD]
    if reverse:
        etypes += [(d, f"rev_{r}", s) for s, r, d in FORWARD]
        srcs, dsts = srcs + dsts, dsts + srcs
    return Graph(
        num_nodes=params.nodes,
        src=np.concatenate(srcs),
        dst=np.concatenate(dsts),
        node_types=tuple(counts),
        edge_types=tuple(etypes),
        node_type_offsets=node_offsets,
        edge_type_offsets=np.concatenate([[0], np.cumsum([len(x) for x in srcs])]).astype(np.int64),
        ndata=_academic_features(params, nt, rng),
        name=params.name or "academic",
    )


def _max_pairs(rel: str, counts: dict[str, int]) -> float:
    """At most half of all possible pairs, so that distinct pairs stay easy to draw."""
    p = counts["paper"]
    other = {"writes": counts["author"], "has_topic": counts["field"]}
    if rel == "cites":
        return p * (p - 1) / 4
    return p * other[rel] / 2
