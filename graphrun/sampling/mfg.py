"""Multi-layer neighbour sampling into message-flow graphs (PyG's hierarchical layout).

:func:`sample_multi_hop` starts from the seeds and, layer by layer, samples the
in-edges of the nodes the previous layer added (the *frontier*), through any
:class:`OneHopSampler` — a local :class:`~graphrun.sampling.csc.CSCGraph` or the
distributed sampler. The result, :class:`SampledSubgraph`, is laid out as PyG's
``NeighborLoader`` lays out a mini-batch, so ``torch_geometric.utils.trim_to_layer``
works on it:

* ``node``: global ids; the seeds first (``batch_size`` of them), then the nodes
  first reached on layer 1, then layer 2, ... (``num_sampled_nodes[h]`` each);
* ``row``/``col``: local indices (into ``node``) of each edge's source and
  destination; edges of layer 1 first (their ``col`` are seeds), then layer 2, ...
  (``num_sampled_edges[h]`` each).

Message-flow graph ``h`` (counting from the seeds) is therefore the prefix of the
edges up to layer ``h``, and layer ``L - h`` of a model needs only the first
``sum(num_sampled_nodes[:h+1])`` nodes — what ``trim_to_layer`` cuts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError
from graphrun.sampling.csc import SampledEdges
from graphrun.sampling.partitioned import shared_tensor
from graphrun.store.routing import compiled_kernels

# A scratch map of this many entries (8 bytes each) is the most a Relabeler allocates;
# bigger id spaces relabel by sorting instead.
MAP_LIMIT = 1 << 26
# New ids are found by scanning a mark array when the id space is at most this many
# times the candidates (a linear scan beats sorting them), else by sorting. With numpy's
# scan the crossing is near 200-300 (one thread: 17k candidates of 200k ids 0.39 ms
# scanned, 0.97 ms sorted; 1k of 2M 0.24 / 0.07 ms; benchmarks/README.md, "Kernels");
# numba's scan (GRAPHRUN_COMPILED=1) crosses numpy's sort near 60 (2k of 200k: 0.068 /
# 0.033 ms; 5k: 0.068 / 0.104).
DENSE_FACTOR = 128


Seed = int | torch.Generator | np.random.Generator | None
RelabelOrder = Literal["id", "first"]


def make_generator(seed: Seed = None) -> torch.Generator:
    """A ``torch.Generator`` from an int, a numpy ``Generator``, a torch generator or None.

    ``None`` gives a generator seeded from the operating system (non-deterministic);
    a numpy generator is consumed once to seed a fresh torch generator.
    """
    if isinstance(seed, torch.Generator):
        return seed
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    elif isinstance(seed, np.random.Generator):
        gen.manual_seed(int(seed.integers(0, 2**62)))
    elif isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        gen.manual_seed(int(seed))
    else:
        raise ArgumentError(
            f"generator: expected an int, torch.Generator or numpy Generator, "
            f"got {type(seed).__name__}"
        )
    return gen


def draw_seed(generator: torch.Generator) -> int:
    """One kernel seed (for a one-hop sampler) from a torch generator."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


class OneHopSampler(Protocol):
    """One hop on numpy arrays (a local :class:`~graphrun.sampling.csc.CSCGraph`, the
    distributed sampler): the same ``seed`` gives the same edges."""

    def sample_one_hop(
        self,
        seeds: Any,
        fanout: Any,
        *,
        replace: bool = False,
        weighted: bool = False,
        seed: int,
    ) -> SampledEdges: ...


@dataclass(frozen=True)
class SampledSubgraph:
    """Sampled message-flow graphs of one mini-batch; see the module docstring."""

    node: Tensor
    row: Tensor
    col: Tensor
    edge: Tensor
    edge_type: Tensor | None
    batch_size: int
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]

    @property
    def num_layers(self) -> int:
        return len(self.num_sampled_edges)

    def edge_index(self) -> Tensor:
        """``[row; col]``: the sampler's own ``[2, E]`` tensor when ``row`` and ``col`` are
        its two rows (:func:`sample_multi_hop` writes them so: no copy), else stacked."""
        base = self.row._base
        if (
            base is not None
            and base is self.col._base
            and base.shape == (2, self.row.numel())
            and base.is_contiguous()
            and self.row.data_ptr() == base.data_ptr()
            and self.col.data_ptr() == base[1].data_ptr()
        ):
            return base
        return torch.stack([self.row, self.col])

    def layer_edges(self, hop: int) -> slice:
        """The slice of ``row``/``col``/``edge`` sampled on layer ``hop`` (1-based)."""
        start = sum(self.num_sampled_edges[: hop - 1])
        return slice(start, start + self.num_sampled_edges[hop - 1])


class Relabeler:
    """Global ids → local ids in order of arrival, for one mini-batch at a time.

    ``order``: how the new ids of a hop are numbered — ``"id"``, by global id (what the
    distributed fetch wants: one owner's rows in a few runs, :mod:`graphrun.store.routing`)
    or ``"first"``, in the order the hop's ids first occur. The hop's edges are grouped
    by destination in the frontier's order, which is the previous hop's new nodes in
    theirs, so under ``"first"`` a layer's compressed rows read each source row first in
    the order it lies in the batch's features: the first reads of layer 0's mean stream,
    and the repeats are mostly hubs, in the caches (:mod:`graphrun.train.aggregate`;
    benchmarks/README.md, "Aggregation in first-read order").

    Owns a scratch map (``-1`` = unseen) over the global id space when that is at
    most ``MAP_LIMIT`` ids, and resets only the entries it touched; above that it
    keeps the known ids sorted and looks them up with ``searchsorted``. It works on
    numpy arrays (tensors in and out share their memory): numpy's ``flatnonzero`` scans
    a mark array or a mask several times faster than ``torch.nonzero`` on one thread
    (benchmarks/README.md, "Kernels"). With ``GRAPHRUN_COMPILED=1`` the map's path runs
    compiled (:mod:`graphrun.sampling.compiled`: the same local ids). The map is int32
    (``MAP_LIMIT`` < 2**31): half the bytes a hop's lookups touch.
    """

    def __init__(self, num_nodes: int, order: RelabelOrder = "id") -> None:
        if order not in ("id", "first"):
            raise ArgumentError(f"order: {order!r} is not 'id' or 'first'")
        self.num_nodes = int(num_nodes)
        self.order = order
        small = self.num_nodes <= MAP_LIMIT
        self._compiled = small and compiled_kernels()
        marks = np.uint8 if self._compiled else np.bool_  # compiled: counted as bytes
        self._map: np.ndarray | None = np.full(self.num_nodes, -1, np.int32) if small else None
        self._mark: np.ndarray | None = np.zeros(self.num_nodes, marks) if small else None
        self._nodes: list[np.ndarray] = []
        self._count = 0
        self._sorted = np.empty(0, dtype=np.int64)
        self._sorted_local = np.empty(0, dtype=np.int64)

    def start(self, seeds: Tensor) -> None:
        self.reset()
        self._insert(seeds.numpy().astype(np.int64, copy=False))

    def _insert(self, new: np.ndarray) -> None:
        local = np.arange(self._count, self._count + len(new), dtype=np.int64)
        if self._map is not None:
            self._map[new] = local
        else:
            keys = np.concatenate([self._sorted, new])
            vals = np.concatenate([self._sorted_local, local])
            order = np.argsort(keys, kind="stable")
            self._sorted, self._sorted_local = keys[order], vals[order]
        self._nodes.append(new)
        self._count += len(new)

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        if self._map is not None:
            return np.take(self._map, ids).astype(np.int64)  # take: half an index's time
        if len(self._sorted) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted, ids), len(self._sorted) - 1)
        hit = self._sorted[pos] == ids
        return np.where(hit, self._sorted_local[pos], -1)

    def add(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Local ids of ``ids`` (unseen ones appended in ``order``) and the new ids."""
        a = ids.numpy().astype(np.int64, copy=False)
        if self._compiled:
            return self._add_compiled(a, ids)
        dense = self._mark is not None and self.num_nodes <= DENSE_FACTOR * len(a)
        if self.order == "id" and dense:
            return self._add_dense(a)  # no sort: scan the marks (sorted by id, deterministic)
        local = self._lookup(a)
        unseen = np.flatnonzero(local < 0)
        if len(unseen) == 0:
            return torch.from_numpy(local), ids[:0]
        cand = a[unseen]
        if self.order == "first":
            new, rank = self._first_seen(cand)
            local[unseen] = self._count + rank
            self._insert(new)
        else:
            new, inverse = np.unique(cand, return_inverse=True)
            local[unseen] = self._count + inverse
            self._insert(new)
        return torch.from_numpy(local), torch.from_numpy(new)

    def _add_dense(self, a: np.ndarray) -> tuple[Tensor, Tensor]:
        """:meth:`add` by id over a dense mark: every id marked, the known ones unmarked,
        the marks scanned (the new ids, sorted), then one lookup of them all (``np.take``:
        a third faster than indexing). No lookup before, no filter of the unseen: about
        half the passes over a hop's ids (a [25, 10] batch of pl200k: 1.5 -> 1.0 ms;
        benchmarks/README.md, "Issue 45: the epoch, round 2")."""
        assert self._map is not None and self._mark is not None
        mark = self._mark
        mark[a] = True
        for known in self._nodes:
            mark[known] = False
        new = np.flatnonzero(mark)
        mark[new] = False
        self._insert(new)
        return torch.from_numpy(np.take(self._map, a).astype(np.int64)), torch.from_numpy(new)

    def _first_seen(self, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(new, rank)``: the distinct ids of ``cand`` in the order they first occur, and
        each occurrence's place in ``new``. Each id's first position (the least of its
        positions, a scatter exact in any order; in the map, whose entries for unseen ids
        are free until :meth:`_insert` writes them) is read back at every occurrence; the
        occurrences that are their id's first give ``new`` in order, and their running
        count at the first position is the rank. No sort where there is a map
        (benchmarks/README.md, "Aggregation in first-read order": the sampler 0.4–0.5 ms
        slower for a [25, 10] batch), and no second lookup of ``cand`` ("one-thread
        sampling with a margin (stop 53)")."""
        n = len(cand)
        if self._map is not None:
            first = self._map
            first[cand] = n
            np.minimum.at(first, cand, np.arange(n, dtype=first.dtype))
            at = np.take(first, cand)
        else:
            _, pos, inverse = np.unique(cand, return_index=True, return_inverse=True)
            at = pos[inverse]
        is_first = at == np.arange(n)  # compress: 5x faster than a boolean index here
        return np.compress(is_first, cand), np.take(np.cumsum(is_first) - 1, at)

    def _add_compiled(self, a: np.ndarray, ids: Tensor) -> tuple[Tensor, Tensor]:
        assert self._map is not None and self._mark is not None
        from graphrun.sampling import compiled  # numba, imported when first asked for

        local, cand = compiled.find(a, self._map, self._mark)
        if len(cand) == 0:
            return torch.from_numpy(local), ids[:0]
        if self.order == "first":  # find's order: first sight
            new = cand
        elif self.num_nodes <= DENSE_FACTOR * len(cand):  # no sort: scan the marks
            new = compiled.scan(self._mark, len(cand))
        else:
            new = np.sort(cand)
        compiled.enter(a, local, self._map, self._mark, new, self._count)
        self._nodes.append(new)
        self._count += len(new)
        return torch.from_numpy(local), torch.from_numpy(new)

    def nodes(self) -> Tensor:
        if not self._nodes:
            return torch.empty(0, dtype=torch.long)
        return torch.from_numpy(np.concatenate(self._nodes))

    def reset(self) -> None:
        if self._map is not None:
            for n in self._nodes:
                self._map[n] = -1
        self._nodes = []
        self._count = 0
        self._sorted = self._sorted[:0]
        self._sorted_local = self._sorted_local[:0]


def sample_multi_hop(
    sampler: OneHopSampler,
    seeds: Tensor,
    fanouts: list[Tensor],
    *,
    relabeler: Relabeler,
    generator: torch.Generator,
    replace: bool = False,
    weighted: bool = False,
) -> SampledSubgraph:
    """Sample ``len(fanouts)`` layers from unique ``seeds`` (fanouts already normalised)."""
    relabeler.start(seeds)
    frontier, offset = seeds, 0
    rows: list[Tensor] = []
    cols: list[Tensor] = []
    edges: list[Tensor] = []
    etypes: list[Tensor] = []
    n_nodes = [int(seeds.numel())]
    n_edges = []
    for fanout in fanouts:
        hop = sampler.sample_one_hop(
            frontier.numpy(),
            fanout.numpy(),
            replace=replace,
            weighted=weighted,
            seed=draw_seed(generator),
        )
        row, new = relabeler.add(shared_tensor(hop.src))
        rows.append(row)
        cols.append(shared_tensor(hop.seed_index) + offset)
        edges.append(shared_tensor(hop.eid))
        if hop.etype is not None:
            etypes.append(shared_tensor(hop.etype))
        offset += frontier.numel()
        frontier = new
        n_nodes.append(int(new.numel()))
        n_edges.append(len(hop))
    node = relabeler.nodes()
    relabeler.reset()
    pair = torch.empty((2, sum(n_edges)), dtype=torch.long)  # PyG's edge_index, no stack
    torch.cat(rows, out=pair[0])
    torch.cat(cols, out=pair[1])
    return SampledSubgraph(
        node=node,
        row=pair[0],
        col=pair[1],
        edge=torch.cat(edges),
        edge_type=torch.cat(etypes) if etypes else None,
        batch_size=int(seeds.numel()),
        num_sampled_nodes=n_nodes,
        num_sampled_edges=n_edges,
    )
