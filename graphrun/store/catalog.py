"""What a client knows of a store's tensors, and the shared memory it has mapped.

:class:`Catalog` keeps the :class:`TensorInfo` of every tensor the client has used
(asked of a server once) and, for the partitions on this machine, maps their
segments read-only on first use. A tensor deleted by another client — and maybe
created again in a new segment — must not be read from the old mapping: each main
server counts its deletions in a shared-memory int64 (``PartitionInfo.deletions``),
and only when that count has moved since the last look does the catalog ``stat``
its mapped segments to find the ones that are gone. A pull costs one memory read,
not a system call.

A tensor served from disk (``TensorInfo.disk``, :mod:`graphrun.store.disk`) has no
segment: for a co-located partition :meth:`Catalog.local_disk` maps the server's cache
and slot index (shared memory, read-only) and the tensor's file, and reads its rows here
as the server would, counting its own hits and bytes (``disk_counters``). The host still
has one cache per partition, within the server's bound.
"""

from __future__ import annotations

import logging

import numpy as np

from graphrun.errors import GraphrunError
from graphrun.store.disk import DISK_COUNTERS, DiskRows, open_info
from graphrun.store.session import Session
from graphrun.store.shm import attach
from graphrun.store.state import TensorInfo, received

log = logging.getLogger("graphrun.store")


class Catalog:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._infos: dict[str, TensorInfo] = {}
        self._local_seg: dict[tuple[str, int], TensorInfo] = {}
        self._arrays: dict[tuple[str, int], np.ndarray] = {}
        self._disk: dict[tuple[str, int], DiskRows] = {}
        self._no_disk: set[tuple[str, int]] = set()  # not readable here: pulled
        self._deletions: dict[int, np.ndarray | None] = {}  # part -> the server's counter
        self._seen: dict[int, int] = {}  # part -> the counter at the last look
        for p, e in session.parts.items():
            for ti in e.info.tensors:
                self.note(ti, p)

    def note(self, ti: TensorInfo, part: int) -> None:
        """What a server said of a tensor (in a join, ``meta`` or ``init`` reply)."""
        self._infos.setdefault(ti.name, ti)
        if self.session.parts[part].local:
            self._local_seg[(ti.name, part)] = ti

    def replace(self, name: str, infos: dict[int, TensorInfo]) -> TensorInfo:
        """A tensor (re)created: its infos from every partition, old mappings dropped."""
        self.forget(name)
        for p, ti in infos.items():
            self.note(ti, p)
        return self._infos[name]

    def meta(self, name: str) -> TensorInfo:
        """Name, policy, dtype and global shape of a tensor visible to this job."""
        self.check_deletions()
        ti = self._infos.get(name)
        if ti is None:
            local = [p for p, e in self.session.parts.items() if e.local] or [0]
            for p in local:
                wire = self.session.call(p, "meta", {"name": name}).body["info"]
                self.note(received(TensorInfo, wire), p)
            ti = self._infos[name]
        return ti

    def forget(self, name: str) -> None:
        self._infos.pop(name, None)
        for p in self.session.parts:
            self._local_seg.pop((name, p), None)
            self._arrays.pop((name, p), None)
            self._disk.pop((name, p), None)

    def check_deletions(self) -> None:
        """Forget the mapped tensors whose segment a server has unlinked since the last
        look (a memory read per mapped partition; a ``stat`` per mapping only after a
        deletion)."""
        for p, counter in self._deletions.items():
            if counter is not None:  # (None: a server without a counter; always look)
                now = int(counter[0])
                if now == self._seen[p]:
                    continue
                self._seen[p] = now
            shm_dir = self.session.parts[p].info.shm_dir
            for (name, part), seg in list(self._local_seg.items()):
                gone = part == p and (name, p) in self._arrays
                if gone and not (shm_dir / seg.segment).exists():
                    self.forget(name)

    def _watch(self, part: int) -> None:
        """Map partition ``part``'s deletion counter (once, before its first mapping)."""
        if part in self._deletions:
            return
        info = self.session.parts[part].info
        if info.deletions is None:
            self._deletions[part] = None
            return
        counter = info.deletions.attach(info.shm_dir)
        self._deletions[part] = counter
        self._seen[part] = int(counter[0])

    def local_array(self, ti: TensorInfo, part: int) -> np.ndarray | None:
        """Partition ``part``'s rows of ``ti`` mapped from shared memory; None when the
        partition is remote (or its memory turns out not to be visible from here)."""
        key = (ti.name, part)
        arr = self._arrays.get(key)
        if arr is not None:
            return arr
        seg = self._local_seg.get(key)
        if seg is None or seg.disk:  # another process's cache: the server answers
            return None
        e = self.session.parts[part]
        try:
            self._watch(part)
            shape = (seg.part_rows, *seg.row_shape)
            arr = attach(e.info.shm_dir, seg.segment, seg.dtype, shape, False)
        except GraphrunError as exc:  # not visible from here after all: use the network
            log.info("shared memory of partition %d not usable (%s)", part, exc)
            self.session.use_network(part)
            return None
        self._arrays[key] = arr
        return arr

    def local_disk(self, ti: TensorInfo, part: int) -> DiskRows | None:
        """Partition ``part``'s rows of the disk tensor ``ti``, read here: the server's
        cache from shared memory, the misses from this process's mapping of the file.
        None when the partition is remote, or the cache or file cannot be mapped from here
        (then the server answers, as it does every later pull of it)."""
        key = (ti.name, part)
        rows = self._disk.get(key)
        if rows is not None or key in self._no_disk:
            return rows
        seg = self._local_seg.get(key)
        if seg is None or not seg.disk or not seg.file:
            return None
        try:
            rows = open_info(seg, self.session.parts[part].info.shm_dir)
        except GraphrunError as exc:
            log.info("disk tensor %s of partition %d not readable here (%s)", ti.name, part, exc)
            self._no_disk.add(key)
            return None
        self._disk[key] = rows
        return rows

    def disk_counters(self) -> dict[str, int]:
        """The hits and bytes of this process's reads of disk tensors (``local_disk``)."""
        got = [r.counters for r in self._disk.values()]
        return {k: sum(getattr(c, k) for c in got) for k in DISK_COUNTERS if k != "cache_bytes"}

    def local_structure(self, part: int) -> dict[str, np.ndarray] | None:
        """The CSC arrays of a co-located partition, mapped read-only; None if remote, or
        if they cannot be mapped (a killed primary's segments removed: its replica answers
        over the network, as :meth:`local_array`'s rows)."""
        e = self.session.part(part)
        if not e.local:
            return None
        self.session.check_revoked(part)
        try:
            return {k: s.attach(e.info.shm_dir) for k, s in e.info.structure.items()}
        except GraphrunError as exc:  # its server gone and its memory with it: the network
            log.info("shared memory of partition %d not usable (%s)", part, exc)
            self.session.use_network(part)
            return None

    def clear(self) -> None:
        self._arrays.clear()
        self._disk.clear()
        self._deletions.clear()
