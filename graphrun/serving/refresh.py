"""Embeddings that stay fresh: keep every layer's states, recompute only what changed.

:func:`full` is the whole-graph pass of :mod:`graphrun.serving.embed` at a version of a
live graph (the head by default), keeping what an incremental refresh needs:

* every layer's states as job tensors: ``serving/<ntype>/hidden<l>`` for the hidden
  layers ``1 .. L-2``, then ``embeddings`` (layer ``L-1``), ``logits`` (layer ``L``) and
  ``predictions``, as the plain pass writes them;
* the new nodes' rows (ids ``>=`` the base ``num_nodes``, which a node-policy tensor has
  no row for): ``serving/<ntype>/grown`` lists them (int64, in the order they were first
  computed) and ``serving/<ntype>/grown/<table>`` holds row ``j`` of the ``j``-th;
* ``serving/<ntype>/version`` (int64): ``[0]`` the version the states are at, ``[1]``
  how many new nodes ``grown`` lists, ``[2]`` the version a refresh is moving them to
  (``[0]`` once it is done; -1 while a kept pass writes them);
* for :func:`by_sums` models, ``serving/<ntype>/insum``, ``lastsum`` and ``lastown``
  (float64, and their ``grown/`` rows): the running sums of :mod:`graphrun.serving.sums`.

:func:`refresh` moves the states from their version ``v0`` to ``v1`` (the head by
default). It asks each partition what changed in ``(v0, v1]``
(:mod:`graphrun.sampling.changes`): ``A_0`` the new nodes and nodes whose input feature
was updated, ``D`` the destinations of added or deleted edges; then ``A_1 = A_0 ∪ D ∪
out(A_0)`` and ``A_l = A_{l-1} ∪ out(A_{l-1})`` (out-neighbours at ``v1``, asked for
the frontier only). Layer ``l`` is recomputed for ``A_l`` alone over full in-neighbourhoods
at ``v1`` (:func:`graphrun.train.inference` 's ``_batch``), reading layer ``l-1``'s fresh
rows for ``A_{l-1}`` and the stored ones for the rest; a node outside ``A_l`` has the
same in-edges and in-neighbour states as at ``v0``, so its stored row is what a full
pass at ``v1`` computes (a test holds the two within 1e-5, fp32). The out-neighbours
are a lookup in each partition's out-edge index (built once, by the kept pass).

On a power-law graph ``out(A_{L-1})`` is large (1,000 random edges reach 13% of a
200k-node graph at two hops) and recomputing a node reads its whole in-neighbourhood.
Where the layers are linear in the sum of their in-neighbours' rows (:func:`by_sums`:
fp32 GraphSAGE) the kept pass also stores the first and the last layer's running sums
(:mod:`graphrun.serving.sums`), and a refresh moves them instead (:func:`_by_sums`) by
the edges that changed (``graph_changes`` tells them) and the edges leaving ``A_{L-1}``
(each adds its source's change, projected by ``W_l``); the nodes downstream of an
updated or new feature (``touched``) are summed again over their in-edges, the hidden
layers between (three layers or more) recomputed as above. Its cost is those edges and
one row of sums for each node of ``A_1`` and ``A_L``, not their in-neighbourhoods.
GAT and bf16 models are recomputed whole.

**A refresh that fails partway** (a partition's server dies, a request times out) has
written some partitions' rows and not the version, which is written last. Before its
first write a refresh to ``v1`` writes ``version[2] = v1``; a refresh that finds
``version[2]`` above ``version[0]`` first finishes that one: it refreshes to ``v1``
again (reading the graph at ``v1``, pinned, even when the head has moved on since; a
compaction past ``v1`` refuses it, and then only ``--live`` helps), then to where it was
asked (one below ``v1`` is refused). Doing it again is right because everything a
refresh writes is computed afresh from the graph at ``v1`` and rows it does not write
(a layer's rows outside ``A_l``), except the running sums, which it reads and moves:
their rows carry a stamp (:mod:`graphrun.serving.sums`), and a retry moves only the rows
not stamped ``v1`` yet. So any number of interrupted tries, then one that completes,
leave the states a single refresh leaves (a test interrupts one after the first
partition's write, with and without the graph moving before the retry). A kept pass
interrupted leaves ``version[2] = -1``, and a refresh says to run ``--live`` again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from graphrun.errors import ArgumentError, GraphrunError, StoreError
from graphrun.names import PolicyName, TensorKey
from graphrun.sampling.changes import OP_OUT_NEIGHBORS
from graphrun.serving import moves
from graphrun.serving.embed import Layers, raise_unsupported, table_name
from graphrun.serving.plan import DENSE, EDGE_IDS, EMPTY, Plan, affected, ask, union
from graphrun.serving.sums import (
    INSUM,
    LASTOWN,
    TABLES,
    before,
    first_layer,
    full_sums,
    move,
    own,
    project,
    signs,
    stamped,
    widths,
)
from graphrun.store import sum_kernels as kernels
from graphrun.store.dist_tensor import DistTensor
from graphrun.train import inference
from graphrun.train.data import NodeTable
from graphrun.train.models import SAGE, ByLayer


def layer_tables(layers: int) -> list[str]:
    """The table of each layer's output ``1 .. L`` (index ``l - 1``)."""
    return [f"hidden{i}" for i in range(1, layers - 1)] + ["embeddings", "logits"]


class States:
    """The stored states of one node type: base rows in node-policy tensors, new nodes'
    rows in their ``grown/`` twins (see the module docstring)."""

    def __init__(self, client: Any, ntype: str) -> None:
        self.client, self.ntype = client, ntype
        self.n = int(client.book.num_nodes)
        self.grown = np.empty(0, np.int64)
        self.pending = 0  # the version an interrupted refresh was moving to (module doc)
        self._order = np.empty(0, np.int64)
        self._tensors: dict[str, DistTensor] = {}  # attached once
        self._listed: set[str] | None = None
        self._writes: list[tuple[DistTensor, np.ndarray, Tensor]] = []  # until flush()
        self._split: tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]] | None = None

    def name(self, what: str) -> str:
        return table_name(self.ntype, what)

    def tensor(self, what: str, width: int | None = None, dtype: str = "float32") -> DistTensor:
        """Table ``what``, attached once; made (``width``: its columns, 0 for a vector)
        if it is not there."""
        if what in self._tensors:
            return self._tensors[what]
        if width is None:
            t = DistTensor(self.client, self.name(what))
        else:
            shape = (self.n,) if width == 0 else (self.n, width)
            t = DistTensor(self.client, self.name(what), shape=shape, dtype=dtype,
                           policy=PolicyName.node(self.ntype), persistent=True)  # fmt: skip
        self._tensors[what] = t
        return t

    def table(self, what: str, width: int, dtype: str) -> DistTensor:
        """Table ``what``: attached if every partition has it (the list, asked once), else
        made (where a partition lacks it: its server was started again since)."""
        if what not in self._tensors:
            if self._listed is None:
                self._listed = {t.name for t in self.client.list_tensors()}
            if self.name(what) in self._listed:
                t = DistTensor(self.client, self.name(what))
                if t.info.row_shape == ((width,) if width else ()) and t.info.dtype == dtype:
                    self._tensors[what] = t  # else made: the store says what differs
        return self.tensor(what, width, dtype)

    def load(self) -> int:
        """The stored version (and the new nodes' list, and :attr:`pending`); StoreError
        if none is stored or a kept pass did not finish them."""
        try:
            meta = self.tensor("version")[torch.arange(3)].numpy()
        except StoreError as exc:
            raise StoreError(f"refresh: no kept states of {self.ntype!r} in the store "
                             "(run `graphrun infer embed --live` first)") from exc  # fmt: skip
        if meta[2] < 0:
            raise StoreError(f"refresh: the kept pass of {self.ntype!r} did not finish "
                             "(run `graphrun infer embed --live` again)")  # fmt: skip
        k, self.pending = int(meta[1]), int(meta[2])
        self._writes = []  # a failed refresh's, not sent
        # the stored new nodes, never a failed refresh's (add_grown): those have no rows
        self.grown = self.tensor("grown")[torch.arange(k)].numpy() if k else EMPTY
        self._order = np.argsort(self.grown, kind="stable")
        self._split = None
        return int(meta[0])

    def add_grown(self, ids: np.ndarray) -> None:
        new = ids[ids >= self.n]
        new = new[~np.isin(new, self.grown)]
        if len(self.grown) + len(new) > self.n:
            raise StoreError(f"refresh: more new nodes than base ones ({self.n}); "
                             "the graph must be compacted first")  # fmt: skip
        self.grown = np.concatenate([self.grown, np.sort(new)])
        self._order = np.argsort(self.grown, kind="stable")
        self._split = None  # the slots it split are not all the same any more

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """Each id's row: itself for a base node, ``n + j`` for the ``j``-th new node."""
        out = ids.copy()
        grow = ids >= self.n
        pos = np.searchsorted(self.grown[self._order], ids[grow])
        out[grow] = self.n + self._order[np.minimum(pos, max(len(self.grown) - 1, 0))]
        return out

    def read(self, what: str, ids: np.ndarray) -> Tensor:
        if any(t.name in (self.name(what), self.name(f"grown/{what}")) for t, _, _ in
               self._writes):  # fmt: skip
            self.flush()
        slots = self.slots(ids)
        grow = np.flatnonzero(slots >= self.n)
        if not len(grow):
            return self.tensor(what)[torch.from_numpy(slots)]
        base = np.flatnonzero(slots < self.n)
        rows = self.tensor(what)[torch.from_numpy(slots[base])]
        out = torch.empty((len(ids), *rows.shape[1:]), dtype=rows.dtype)
        out[torch.from_numpy(base)] = rows
        out[torch.from_numpy(grow)] = self.tensor(f"grown/{what}")[
            torch.from_numpy(slots[grow] - self.n)
        ]
        return out

    def write(self, what: str, ids: np.ndarray, rows: Tensor) -> None:
        """Rows of ``ids`` into table ``what`` (made if it is not there), at the next
        :meth:`flush`: every table's rows in one request a partition."""
        width = 0 if rows.dim() == 1 else int(rows.size(1))
        dtype = str(rows.dtype).replace("torch.", "")
        if self._split is None or self._split[0] is not ids:  # tables of one set: split once
            slots = self.slots(ids)
            base = slots < self.n
            self._split = (ids, [(base, slots[base]), (~base, slots[~base] - self.n)])
        for name, (pick, at) in zip((what, f"grown/{what}"), self._split[1], strict=True):
            if not len(at):
                continue
            mine = rows if len(at) == len(ids) else rows[torch.from_numpy(pick)]
            self._writes.append((self.table(name, width, dtype), at, mine))

    def flush(self) -> None:
        """Send the writes :meth:`write` kept and wait for their answers (:meth:`send`)."""
        self.send()()

    def send(self) -> Callable[[], None]:
        """Send the writes :meth:`write` kept (:meth:`KVClient.send_tables`): a callable
        that waits for their answers."""
        writes, self._writes = self._writes, []
        items = [(t.name, s, r.numpy().astype(t.np_dtype, copy=False)) for t, s, r in writes]
        return self.client.send_tables(items) if items else lambda: None

    def warm(self, feature: NodeTable, layers: int, sums: bool) -> None:
        """Attach every table a refresh reads and writes, map the co-located ones (a row
        of each read) and load the sums' compiled loops, here and on the servers
        (:mod:`.moves`): what a refresher that stays up does once, not per refresh."""
        tables = [*layer_tables(layers), "predictions", *(TABLES if sums else ())]
        if sums:
            kernels.warm_up()
            moves.warm(self.client, self.name)
        pol = self.client.policy(self.name(layer_tables(layers)[-1]))
        firsts = np.unique(np.minimum(pol.ranges[:-1], self.n - 1)).astype(np.int64)
        feature[torch.from_numpy(firsts)]  # a row of each partition
        for what in tables:
            self.read(what, firsts)
        self._listed = self._listed or {t.name for t in self.client.list_tensors()}

    def drop(self, *tables: str, keep: dict[str, int] | None = None) -> None:
        """Delete ``tables`` (and their ``grown/`` twins) where the store has them, but
        those with rows ``keep[table]`` wide."""
        have = {t.name: t.row_shape for t in self.client.list_tensors(anywhere=True)}
        gone = [t for t in tables if have.get(self.name(t)) != ((keep or {}).get(t),)]
        for name in [self.name(w) for t in gone for w in (t, f"grown/{t}")]:
            if name in have:
                self.client.delete_tensor(name)

    def begin(self, version: int) -> Callable[[], None]:
        """Say, before any write, the version the states are moving to (-1: a kept pass):
        what a retry of a refresh that failed partway must finish (module docstring).
        Sent now: a callable that waits for its answer, called before the first write."""
        t = self.tensor("version", 0, "int64")
        return self.client.send_tables([(t.name, np.array([2]), np.array([version]))])

    def save(self, version: int) -> None:
        """The kept writes, then (once they are all in) the version they are at."""
        if len(self.grown):
            t = self.tensor("grown", 0, "int64")
            self._writes.append((t, np.arange(len(self.grown)), torch.from_numpy(self.grown)))
        self.flush()
        self.tensor("version", 0, "int64")[torch.arange(3)] = torch.tensor(
            [version, len(self.grown), version]
        )
        self.pending = version


class Fresh:
    """A layer's input as :func:`inference._batch` reads it: ``fresh`` rows of the nodes
    just recomputed, the stored table (or the feature) for the rest."""

    def __init__(self, read: Any, ids: np.ndarray, rows: Tensor | None) -> None:
        self.read, self.ids, self.rows = read, ids, rows  # ids sorted

    def __getitem__(self, ids: Tensor) -> Tensor:
        a = ids.numpy()
        if self.rows is None or not len(self.ids):
            return self.read(a)
        pos = np.minimum(np.searchsorted(self.ids, a), len(self.ids) - 1)
        hit = self.ids[pos] == a
        found, rest = np.flatnonzero(hit), np.flatnonzero(~hit)
        if not len(rest):
            return self.rows[torch.from_numpy(pos)]
        if not len(found):
            return self.read(a).to(self.rows.dtype)
        out = torch.empty((len(a), self.rows.size(1)), dtype=self.rows.dtype)
        out[torch.from_numpy(found)] = self.rows[torch.from_numpy(pos[found])]
        out[torch.from_numpy(rest)] = self.read(a[rest]).to(self.rows.dtype)
        return out


def _check(model: ByLayer, data: Any) -> int:
    if not inference.supports(model, data):
        raise_unsupported()
    layers = len(model.convs)
    if layers < 2:
        raise ArgumentError("refresh: a model of one layer has no states to keep; "
                            "`graphrun infer embed` recomputes it whole")  # fmt: skip
    return layers


def by_sums(model: ByLayer) -> bool:
    """Whether the states move by running sums (:mod:`graphrun.serving.sums`): fp32
    GraphSAGE, whose layers are linear in the sum of their in-neighbours' rows."""
    return isinstance(model, SAGE) and model.precision == "fp32"


@torch.no_grad()
def _layers(model: ByLayer, data: Any, st: States, feature: str, plan: Plan, batch: int,
            sums: bool = False) -> list[float]:  # fmt: skip
    """Recompute layer ``l`` for ``plan.sets[l-1]``, ``l = 1 .. L``, and store it (with
    ``sums``, the first and last layers' sums too); the seconds of each layer."""
    model.eval()
    run = Layers(model, 0, len(model.convs))
    feat = data.node_table(st.ntype, feature)
    h = Fresh(lambda a: feat[torch.from_numpy(a)].float(), EMPTY, None)
    tables = layer_tables(len(model.convs))
    step = max(batch, inference.MIN_BATCH)
    took = []
    for i, (ids, what) in enumerate(zip(plan.sets, tables, strict=True)):
        t0 = time.perf_counter()
        read = cast(NodeTable, h)  # gather only reads it
        out, kept = [], []
        for lo in range(0, len(ids), step):
            dst = torch.from_numpy(ids[lo : lo + step])
            x, edge_index = inference.gather(read, dst, data)
            out.append(run.layer(i, x, edge_index, dst.numel()))
            if sums and i in (0, len(tables) - 1):
                kept.append(full_sums(model, i > 0, x, edge_index, dst.numel(), plan.to))
        rows = torch.cat(out) if out else torch.empty(0, 1)
        for name in kept[0] if kept else ():
            st.write(name, ids, torch.cat([k[name] for k in kept]))
        st.write(what, ids, rows)
        if what == "logits":
            st.write("predictions", ids, rows.argmax(-1).long())
        st.flush()  # a layer's rows at a time (a kept pass holds no more)
        h = Fresh(lambda a, w=what: st.read(w, a).float(), ids, rows)
        took.append(round(time.perf_counter() - t0, 3))
    return took


@torch.no_grad()
def _by_sums(model: ByLayer, data: Any, st: States, feature: str, plan: Plan, batch: int,
             begin: Callable[[], Callable[[], None]]) -> list[float]:  # fmt: skip
    """The refresh of :func:`by_sums` models: the first layer from its moved (or, for
    ``touched``, recomputed) sums, the hidden layers between recomputed, the last layer
    from its moved sums; each layer's rows stored; the seconds of each layer. ``begin``
    sends the version it moves to (``States.begin``), whose answer is waited for once
    the first layer is computed (it only reads) and before anything is written: the
    round trip, and the lookup of the edges leaving ``A_{L-1}`` (:class:`Plan`) on the
    server it writes to, overlap the first layer. ``A_{L-1}``'s rows are sent before
    the last layer's moves are computed, and waited for with them."""
    model.eval()
    assert plan.changed is not None
    try:
        kept = {what: st.tensor(what).info.row_shape for what in TABLES}
    except StoreError as exc:
        raise StoreError(f"refresh: the kept states of {st.ntype!r} have no running sums "
                         "(run `graphrun infer embed --live` again)") from exc  # fmt: skip
    for what, width in widths(model).items():
        if kept[what] != (width,):  # kept by an earlier layout or model
            raise StoreError(
                f"refresh: {st.name(what)} has rows of {kept[what]}, this model "
                f"keeps ({width},) (run `graphrun infer embed --live` again)"
            )
    layers, tables = len(model.convs), layer_tables(len(model.convs))
    feat = data.node_table(st.ntype, feature)
    t0, took = time.perf_counter(), []
    started = begin()  # its answer waited for after the first layer, which only reads
    try:
        ids, rows = _first(model, data, st, feat, plan)
    except BaseException:
        with contextlib.suppress(GraphrunError):
            started()
        raise
    started()
    st.write(INSUM, ids, rows[1])
    prev = rows[0]
    run, step = Layers(model, 0, layers), max(batch, inference.MIN_BATCH)
    for i in range(1, layers - 1):  # hidden layers between: over their in-neighbourhoods
        took.append(round(time.perf_counter() - t0, 3))
        t0 = time.perf_counter()
        st.write(tables[i - 1], ids, prev)
        h = Fresh(lambda a, w=tables[i - 1]: st.read(w, a).float(), ids, prev)
        ids = plan.sets[i]
        out = [inference._batch(run, i, cast(NodeTable, h), torch.from_numpy(ids[lo : lo + step]),
                                data) for lo in range(0, len(ids), step)]  # fmt: skip
        prev = torch.cat(out) if out else torch.empty(0, 1)
    took.append(round(time.perf_counter() - t0, 3))
    t0 = time.perf_counter()
    need, src, mine = _own(model, st, plan, tables[-2], ids, prev)
    sent = st.send()  # A_1's rows on their way while the moves are computed
    try:
        plan.finish()  # the edges leaving A_{L-1}, asked before the first layer
        st.add_grown(plan.sets[-1])
        _last(st, plan, ids, need, src, mine)()
    finally:
        sent()
    took.append(round(time.perf_counter() - t0, 3))
    return took


def _first(model: ByLayer, data: Any, st: States, feat: Any, plan: Plan
           ) -> tuple[np.ndarray, tuple[Tensor, Tensor]]:  # fmt: skip
    """Layer 1 of ``A_1``: ``(ids, (rows, their sums))``."""
    assert plan.changed is not None
    a1, redo = plan.sets[0], plan.touched
    rest = np.setdiff1d(a1, redo, assume_unique=True)
    ch = plan.changed[:, np.isin(plan.changed[1], rest)]  # no source in A_0 (module doc)
    ask = union([a1, ch[0]])
    x = feat[torch.from_numpy(ask)].float()
    sums = torch.empty(len(a1), x.size(1) + 2, dtype=torch.float64)
    if len(rest):
        old = st.read(INSUM, rest)
        todo = ~stamped(old, plan.to)  # not moved by an interrupted try already
        move(old, _pos(rest, ch[1]), x, _pos(ask, ch[0]), todo, signs(ch))
        old[:, -1] = plan.to
        sums[_at(a1, rest)] = old
    for lo in range(0, len(redo), EDGE_IDS):  # summed again over their in-edges
        dst = torch.from_numpy(redo[lo : lo + EDGE_IDS])
        got = full_sums(model, False, *inference.gather(feat, dst, data), dst.numel(), plan.to)
        sums[_at(a1, dst.numpy())] = got[INSUM]
    return a1, (first_layer(model, sums, x[_at(ask, a1)]), sums)


def _own(model: ByLayer, st: States, plan: Plan, what: str, ids: np.ndarray, h: Tensor
         ) -> tuple[np.ndarray, Tensor, Tensor]:  # fmt: skip
    """The last layer's parts of ``ids = A_{L-1}``, whose new rows are ``h`` (written to
    table ``what`` at the next :meth:`States.send`): ``(need, src, mine)`` with ``need``
    those nodes and the changed edges' sources (sorted), ``src`` each one's ``W_l h``
    before and after, ``mine`` ``A_{L-1}``'s own parts before and after (float32: fp32
    products). The old rows are ``lastown``'s (the old ``h`` is not read); the servers
    that move the sums write ``A_{L-1}``'s new ``lastown`` rows (:mod:`.moves`)."""
    assert plan.changed is not None
    need = union([ids, plan.changed[0]])
    old = before(_rows(st, LASTOWN, need, plan.new), plan.to)  # [W_l h, W_r h + b] before
    c = old.size(1) // 2
    at = _at(need, ids)
    src = torch.cat([old[:, :c], old[:, :c]], dim=1).float()  # before, after
    src[at, c:] = project(model, h)
    st.write(what, ids, h)
    return need, src, torch.cat([old[at, c:].float(), own(model, h).float()], dim=1)


def _last(st: States, plan: Plan, ids: np.ndarray, need: np.ndarray, src: Tensor,
          mine: Tensor) -> Callable[[], None]:  # fmt: skip
    """The last layer of ``A_L`` from its sums, moved on their servers (:mod:`.moves`,
    which says how; they write the logits, predictions and ``A_{L-1}``'s ``lastown``
    rows too), ``ids = A_{L-1}``, ``need``, ``src`` and ``mine`` as :func:`_own` gives
    them: a callable that waits for the moves' answers."""
    assert plan.changed is not None and plan.edges is not None
    ch, e1, al = plan.changed, plan.edges, plan.sets[-1]
    slots = st.slots(al)
    c = src.size(1) // 2
    for prefix in ["", "grown/"] if (slots >= st.n).any() else [""]:
        for name, width, dtype in zip(moves.TABLES, (c + 2, c, 0, 4 * c + 1), moves.DTYPES,
                                      strict=True):  # fmt: skip
            st.table(prefix + name, width, dtype)
    edges = (_pos(al, ch[1]), _pos(need, ch[0]), ch[2]), (_pos(al, e1[1]), _pos(need, e1[0]))
    got = moves.Moves(slots, np.isin(al, plan.new), src.numpy(), *edges, _pos(al, ids),
                      mine.numpy(), _pos(need, ids))  # fmt: skip
    return moves.send(st.client, st.name, st.n, got, plan.to)


def _rows(st: States, what: str, ids: np.ndarray, new: np.ndarray) -> Tensor:
    """The stored rows of sorted ``ids`` in ``what``; zeros for the ``new`` nodes."""
    if not len(new) or not np.isin(new, ids).any():
        return st.read(what, ids)
    had = np.setdiff1d(ids, new, assume_unique=True)
    got = st.read(what, had)
    out = torch.zeros((len(ids), *got.shape[1:]), dtype=got.dtype)
    out[_at(ids, had)] = got
    return out


def _at(ids: np.ndarray, of: np.ndarray) -> Tensor:
    """The positions of ``of`` in the sorted ``ids`` (each of them there)."""
    return torch.from_numpy(_pos(ids, of))


def _pos(ids: np.ndarray, of: np.ndarray) -> np.ndarray:
    """:func:`_at` as numpy: a table of positions where the largest id is below ``DENSE``
    times the ids (45k ids in 27k: 0.1 ms, a binary search 4 ms), else a binary search."""
    if not len(ids) or int(ids[-1]) >= DENSE * (len(ids) + len(of)):
        return np.searchsorted(ids, of)
    table = np.empty(int(ids[-1]) + 1, np.int64)
    table[ids] = np.arange(len(ids))
    return table[of]


def full(
    model: ByLayer, data: Any, ntype: str, feature: str, batch_size: int,
    version: int | None = None,
) -> dict[str, float | int]:  # fmt: skip
    """Every node's states at ``version`` (the head) into the store, kept for
    :func:`refresh` (see the module docstring); what it took."""
    layers = _check(model, data)
    t0 = time.perf_counter()
    client = data.graph.ctx.client
    v = int(client.follow(version))
    st = States(client, ntype)
    new, _ = client.live_nodes()
    st.add_grown(new)
    ids = np.concatenate([np.arange(data.num_nodes(ntype), dtype=np.int64), new])
    sums = by_sums(model)  # sums not of this version or layout: made again, or refused
    st.drop(*TABLES, keep=widths(model) if sums else None)
    st.begin(-1)()
    _layers(model, data, st, feature, Plan([ids] * layers, ids, to=v), batch_size, sums)
    st.save(v)
    ask(client, OP_OUT_NEIGHBORS, {}, (EMPTY,))  # each builds its index now
    return {"version": v, "nodes": len(ids), "recomputed": len(ids),
            "full_pass_s": round(time.perf_counter() - t0, 3)}  # fmt: skip


def refresh(
    model: ByLayer, data: Any, ntype: str, feature: str, batch_size: int,
    version: int | None = None, states: States | None = None,
) -> dict[str, float | int | list[int]]:  # fmt: skip
    """Move the kept states from their version to ``version`` (the head), recomputing
    only the nodes whose in-neighbourhood changed; what it took and how many it
    recomputed (``recomputed``: at the last layer, the most of any layer). ``states``:
    the :class:`States` of an earlier refresh of this process (:mod:`.follow`), its
    tables attached and mapped already. A refresh that failed partway is finished first
    (module docstring): then this is the pass from its version."""
    layers = _check(model, data)
    t0, cpu0 = time.perf_counter(), time.process_time()
    client = data.graph.ctx.client
    st = States(client, ntype) if states is None else states
    since = st.load()
    v = int(client.follow(version))
    if v < since:
        raise ArgumentError(f"version: {v} is below the kept states' version {since}")
    if since < st.pending != v:
        if v < st.pending:
            raise ArgumentError(f"version: {v} is below {st.pending}, the version an "
                                f"interrupted refresh of {ntype!r} was moving to")  # fmt: skip
        refresh(model, data, ntype, feature, batch_size, st.pending, st)
        return refresh(model, data, ntype, feature, batch_size, v, st)
    key = str(TensorKey.node(ntype, feature))
    sums = by_sums(model)
    plan = affected(client, since, layers, key, st, sums)
    plan.to = v
    found_s = time.perf_counter() - t0
    try:  # sums: the edges leaving A_{L-1} on their way meanwhile (.plan)
        st.add_grown(plan.sets[-1])  # A_{L-1} where A_L is not known yet: the rest later
        if sums:
            took = _by_sums(model, data, st, feature, plan, batch_size, lambda: st.begin(v))
            whole = [len(plan.touched), *(len(s) for s in plan.sets[1:-1]), 0]
        else:
            st.begin(v)()
            took = _layers(model, data, st, feature, plan, batch_size)
            whole = [len(s) for s in plan.sets]
    except BaseException:
        plan.drop()  # the answers still owed
        raise
    st.save(v)
    per_layer = [len(s) for s in plan.sets]
    return {"version": v, "since": since, "nodes": data.num_nodes(ntype) + len(st.grown),
            "recomputed": max(whole), "per_layer": per_layer, "recomputed_per_layer": whole,
            "updated": sum(per_layer) - sum(whole),
            "find_s": round(found_s, 3), "layer_s": took,
            "refresh_s": round(time.perf_counter() - t0, 4),
            "cpu_s": round(time.process_time() - cpu0, 4)}  # fmt: skip
