"""The live graph's sequencer state (issue 42): partition 0's primary hands out versions
and growth ids, keeps the new nodes' original ids and each version's decision. Its
operations are :mod:`graphrun.store.live_ops`'s; its log and replay
:mod:`graphrun.store.live_log`'s."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphrun.store.live import Blocks


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

    def begin(
        self, nodes: list[int], edges: list[int], orig: np.ndarray, now: float
    ) -> tuple[int, list[list[tuple[int, int]]], list[list[tuple[int, int]]]]:
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
