"""The live graph's sequencer state (issue 42): partition 0's primary hands out versions
and growth ids, keeps the new nodes' original ids and each version's decision. Its
operations are :mod:`graphrun.store.live_ops`'s; its log and replay
:mod:`graphrun.store.live_log`'s. Partition 0's replica keeps a copy (every change is
a forwarded write: :mod:`graphrun.store.replicas`).

A partition reaches the sequencer through a :class:`SeqLink`: the address and the
replicas' addresses the last writer named (``live_prepare``), in failover order. When
the sequencer's connection is lost, or it is fenced, or silent for the store's request
timeout (a machine gone without a word), the partition asks the next replica, which
holds every decision the primary acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from graphrun.errors import ArgumentError, GraphrunError, RpcError, RpcTimeout, StoreError
from graphrun.store.live import (
    GROWTH_BLOCK,
    MAX_GROWTH_BLOCKS,
    MAX_LIVE_NODES,
    MAX_PIECE_ROWS,
    MAX_UNDECIDED,
)
from graphrun.store.live_wire import Runs
from graphrun.store.replicas import is_dropped, is_fenced

if TYPE_CHECKING:
    from graphrun.rpc.auth import KeyPair
    from graphrun.rpc.transport import RpcClient

log = logging.getLogger("graphrun.store")

FATE_TIMEOUT_S = 2.0  # a partition asking the sequencer a piece's fate waits this long
MAX_SEQ_ADDRESSES = 8  # the sequencer and its replicas, as a writer names them
MAX_ADDRESS_LEN = 256


class Blocks:
    """One id space's growth blocks (the sequencer's): owner per block, and each
    partition's open block with how many of its ids are handed out."""

    def __init__(self, base: int, num_parts: int) -> None:
        self.base = base
        self.owners: list[int] = []
        self.open: dict[int, tuple[int, int]] = {}  # part -> (block, ids used)
        self.num_parts = num_parts

    def allocate(self, part: int, count: int) -> list[tuple[int, int]]:
        """``count`` fresh ids owned by ``part`` as ``[(start, count), ...]`` runs."""
        runs: list[tuple[int, int]] = []
        while count > 0:
            block, used = self.open.get(part, (-1, GROWTH_BLOCK))
            if used == GROWTH_BLOCK:
                if len(self.owners) >= MAX_GROWTH_BLOCKS:
                    raise StoreError(
                        f"live: {MAX_GROWTH_BLOCKS} growth blocks are handed out; "
                        "the graph must be compacted first"
                    )
                block, used = len(self.owners), 0
                self.owners.append(part)
            k = min(count, GROWTH_BLOCK - used)
            runs.append((self.base + block * GROWTH_BLOCK + used, k))
            self.open[part] = (block, used + k)
            count -= k
        return runs

    def owner_array(self) -> np.ndarray:
        return np.asarray(self.owners, dtype=np.int64)


Begun = tuple[int, Runs, Runs]  # a live_begin's version, node runs, edge runs


@dataclass
class Sequencer:
    """Partition 0's: versions, growth ids, original ids, decisions and the head."""

    nodes: Blocks
    edges: Blocks
    next_version: int = 1
    head: int = 0
    begun: dict[int, float] = field(default_factory=dict)  # undecided -> when begun
    decided: dict[int, bool] = field(default_factory=dict)  # above the head: committed?
    aborted: set[int] = field(default_factory=set)
    orig: dict[int, int] = field(default_factory=dict)  # orig id -> graph id (committed)
    orig_pending: dict[int, dict[int, int]] = field(default_factory=dict)  # version -> map
    base_orig: tuple[np.ndarray, np.ndarray] | None = None  # sorted orig ids, their ids
    # (session, write id) -> (version, node runs, edge runs) of each live_begin still
    # undecided: a writer that failed over sends the ones in flight (pipelined) again and
    # gets the same answers (bounded by begun)
    answers: dict[tuple[str, int], Begun] = field(default_factory=dict)

    def begin(self, nodes: list[int], edges: list[int], orig: np.ndarray, now: float) -> Begun:
        """A new version and its ids: ``(version, node runs, edge runs)`` per partition."""
        version = self.next_version
        node_runs = [self.nodes.allocate(p, c) for p, c in enumerate(nodes)]
        edge_runs = [self.edges.allocate(p, c) for p, c in enumerate(edges)]
        self.next_version += 1
        self.begun[version] = now
        ids = [s + k for runs in node_runs for s, c in runs for k in range(c)]
        self.orig_pending[version] = dict(zip(orig.tolist(), ids, strict=True))
        return version, node_runs, edge_runs

    def decide(self, version: int, commit: bool) -> bool:
        """Record the decision (the first one stands); whether the version committed."""
        if version in self.begun:
            del self.begun[version]
            self.answers = {k: a for k, a in self.answers.items() if a[0] != version}
            self.decided[version] = commit
            mapping = self.orig_pending.pop(version, {})
            if commit:
                self.orig.update(mapping)
            else:
                self.aborted.add(version)
            while self.decided.get(self.head + 1) is not None:
                self.head += 1
                del self.decided[self.head]
        return version not in self.aborted and version < self.next_version

    def fate(self, version: int) -> str:
        if version in self.begun:
            return "pending"
        if version in self.aborted or version >= self.next_version:
            return "aborted"
        return "committed"


def check_decided(seq: Sequencer, decided: list[tuple[int, bool]], op: str) -> None:
    """ArgumentError unless the decisions a ``live_begin`` carries are within bounds, each
    of a version begun."""
    if len(decided) > MAX_UNDECIDED:
        raise ArgumentError(f"{op}: field 'decided' carries more than {MAX_UNDECIDED} decisions")
    for v, _ in decided:
        if not 0 < v < seq.next_version:
            raise ArgumentError(f"{op}: field 'decided': version {v} was never begun")


def check_begin(
    seq: Sequencer, parts: int, nodes: list[int], edges: list[int], orig: np.ndarray,
    deciding: int, op: str,
) -> None:  # fmt: skip
    """The refusals of a ``live_begin`` before anything is handed out: its counts per
    partition and new nodes' original ids (tensor 0) malformed (ArgumentError), or too
    many versions undecided (less the ``deciding`` it decides) or new nodes held
    (StoreError)."""
    for name, counts in (("nodes", nodes), ("edges", edges)):
        if len(counts) != parts or any(c < 0 or c > MAX_PIECE_ROWS for c in counts):
            raise ArgumentError(
                f"{op}: field {name!r} must give {parts} counts in [0, {MAX_PIECE_ROWS}]"
            )
    if orig.ndim != 1 or orig.dtype != np.int64 or len(orig) != sum(nodes):
        raise ArgumentError(f"{op}: tensor 0 must be the {sum(nodes)} new nodes' original "
                            f"ids (1-d int64), got {orig.dtype} {orig.shape}")  # fmt: skip
    if len(seq.begun) - deciding >= MAX_UNDECIDED:
        raise StoreError(f"{op}: {MAX_UNDECIDED} versions are begun and undecided; "
                         "decide them first (or wait for their timeout)")  # fmt: skip
    held = len(seq.orig) + sum(len(m) for m in seq.orig_pending.values())
    if held + len(orig) > MAX_LIVE_NODES:
        raise StoreError(f"{op}: the live graph would hold more than {MAX_LIVE_NODES} "
                         "new nodes (MAX_LIVE_NODES): compaction must run first")  # fmt: skip


def check_new_orig(
    seq: Sequencer, base_orig: Callable[[], np.ndarray], orig: np.ndarray, op: str
) -> None:
    """ArgumentError if an original id repeats, is a base node's or is taken already
    (each looked up in the new nodes' maps: no set of them all a begin, nothing for a
    batch without new nodes)."""
    if len(orig) == 0:
        return
    if len(np.unique(orig)) != len(orig):
        raise ArgumentError(f"{op}: the new nodes' original ids repeat")
    maps = [seq.orig, *seq.orig_pending.values()]  # committed, then each undecided version's
    found, _ = base_lookup(seq, base_orig, orig)
    for i, o in enumerate(orig.tolist()):
        if found[i] or any(o in m for m in maps):
            raise ArgumentError(f"{op}: original id {o} is a node of the graph already")


def base_lookup(
    seq: Sequencer, base_orig: Callable[[], np.ndarray], orig: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(found, graph ids)`` of original ids among the base nodes (mapping/ files)."""
    if seq.base_orig is None:
        m = np.asarray(base_orig(), dtype=np.int64)
        order = np.argsort(m, kind="stable")
        seq.base_orig = (m[order], order.astype(np.int64))
    keys, ids = seq.base_orig
    pos = np.minimum(np.searchsorted(keys, orig), max(len(keys) - 1, 0))
    found = keys[pos] == orig if len(keys) else np.zeros(len(orig), bool)
    return found, np.where(found, ids[pos], -1)


def check_addresses(seq: str, replicas: list[str], op: str) -> None:
    """ArgumentError unless the sequencer's addresses a writer gave are within bounds."""
    if len(replicas) + 1 > MAX_SEQ_ADDRESSES:
        raise ArgumentError(f"{op}: field 'seq_replicas' names more than "
                            f"{MAX_SEQ_ADDRESSES - 1} replicas")  # fmt: skip
    if any(len(a) > MAX_ADDRESS_LEN for a in (seq, *replicas)):
        raise ArgumentError(f"{op}: a sequencer address is longer than {MAX_ADDRESS_LEN}")


@dataclass
class SeqLink:
    """A partition's way to the sequencer (see the module docstring)."""

    keys: KeyPair | None
    timeout: float
    address: str = ""
    replicas: list[str] = field(default_factory=list)
    client: RpcClient | None = None
    silent_since: float | None = None

    def point(self, address: str, replicas: list[str]) -> None:
        """The sequencer is at ``address`` now, then at ``replicas`` in turn."""
        if address != self.address:
            self.close()
        self.address, self.replicas = address, list(replicas)

    def fate(self, version: int) -> str:
        """``live_fate`` of ``version``; StoreError if no sequencer says it."""
        while True:
            if not self.address:
                raise StoreError(f"live: version {version} is pending and the sequencer is unknown")
            fresh = self.client is None
            if self.client is None:
                from graphrun.rpc.transport import RpcClient

                self.client = RpcClient(self.address, keys=self.keys, timeout=self.timeout,
                                        give_up_if_refused=bool(self.replicas))  # fmt: skip
            ask = min(self.timeout, FATE_TIMEOUT_S)  # the server waits on it: briefly
            try:
                reply = self.client.call("live_fate", {"version": version}, timeout=ask)
            except GraphrunError as exc:
                if type(exc) is RpcTimeout and not fresh:
                    self.close()  # connected before: a new connect is refused if it is gone
                    continue
                if self._fail_over(exc):
                    continue
                raise StoreError(f"live: the sequencer at {self.address} did not say the "
                                 f"fate of version {version} ({exc})") from exc  # fmt: skip
            self.silent_since = None
            return str(reply.body.get("fate"))

    def _fail_over(self, exc: GraphrunError) -> bool:
        """Whether the next replica is to be asked (it is then the address): the
        sequencer refused the connect or lost it, is fenced, is a replica dropped from
        the write set (it refuses: never promoted), or was silent for the store's request
        timeout."""
        if type(exc) is RpcTimeout:
            now = time.monotonic()
            if self.silent_since is None:
                self.silent_since = now
            gone = now - self.silent_since >= self.timeout
        else:
            gone = type(exc) is RpcError or is_fenced(exc) or is_dropped(exc)
        if not gone or not self.replicas:
            return False
        lost = self.address
        self.point(self.replicas[0], self.replicas[1:])
        self.silent_since = None
        log.warning("live: the sequencer %s is lost (%s); asking its replica %s",
                    lost, exc, self.address)  # fmt: skip
        return True

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
