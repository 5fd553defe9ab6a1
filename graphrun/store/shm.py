"""Shared-memory segments: numpy arrays backed by files in ``/dev/shm`` (tmpfs).

Every store instance gets a unique prefix that records its owner::

    graphrun-<pid>-<process start time, ms>-<random token>.<seq>

so two stores on one kernel never collide, and a later store can tell whether the
owner of a segment is still alive (pid exists *and* started at that time: pid reuse
is detected). :func:`clean_stale` removes the segments of dead owners at start-up;
:meth:`SegmentStore.close` unlinks the segments an instance created on shutdown.

Plain files plus ``mmap`` are used instead of ``multiprocessing.shared_memory``
because its resource tracker unlinks segments when *attaching* processes exit
(Python < 3.13). Attaching processes (backup servers, co-located clients) map the
files read-only or read-write; a mapping stays valid after the file is unlinked.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import itertools
import json
import logging
import mmap
import os
import re
import secrets
import select
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from graphrun.errors import StoreError

log = logging.getLogger("graphrun.store")

DEFAULT_SHM_DIR = Path("/dev/shm")
_NAME = re.compile(r"^graphrun-(\d+)-(\d+)-[0-9a-f]+\.\d+$")


def _start_ms(pid: int) -> int | None:
    """When ``pid`` started (ms), or None if it is gone or a zombie: a store killed with
    its machine stays one until reaped, and its parent died too (PID 1 may never do it)."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return int(p.create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def instance_prefix(pid: int | None = None) -> str:
    """A fresh, unique segment prefix owned by ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"graphrun-{pid}-{_start_ms(pid) or 0}-{secrets.token_hex(4)}"


def process_alive(pid: int, start_ms: int) -> bool:
    """Whether process ``pid`` runs and started at ``start_ms`` (pid reuse detected)."""
    now = _start_ms(pid)
    return now is not None and abs(now - start_ms) <= 10


def start_ms() -> int:
    """This process's start time, as segment names and backup registrations record it."""
    return _start_ms(os.getpid()) or 0


def owner_alive(segment: str) -> bool:
    """Whether the process named in a segment name still runs (same pid, same start)."""
    m = _NAME.match(segment)
    if not m:
        return True  # not ours: never touch it
    return process_alive(int(m.group(1)), int(m.group(2)))


class OwnerWatch:
    """Whether the process that owns a segment has exited, answered by one ``poll`` of a
    pidfd (about 2 us; reading ``/proc`` costs ~100x more), cheap enough for every pull."""

    def __init__(self, segment: str) -> None:
        self._fd: int | None = None
        self._poll: select.poll | None = None
        m = _NAME.match(segment)
        if not m or not owner_alive(segment):
            return
        try:
            self._fd = os.pidfd_open(int(m.group(1)))
        except (OSError, AttributeError):  # no pidfds here: never report it gone
            return
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        if not owner_alive(segment):  # the pid was reused between the check and the open
            self.close()

    def gone(self) -> bool:
        return self._poll is not None and bool(self._poll.poll(0))

    def watching(self) -> bool:
        """Whether :meth:`gone` can tell (a pidfd of the owner, alive when it was made)."""
        return self._poll is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._poll = None, None


def clean_stale(shm_dir: Path = DEFAULT_SHM_DIR) -> list[str]:
    """Unlink graphrun segments whose owner process is gone; returns their names."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(shm_dir))
    except FileNotFoundError:
        return removed
    for e in entries:
        if _NAME.match(e.name) and not owner_alive(e.name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
                removed.append(e.name)
    if removed:
        log.info("removed %d stale shared-memory segments of dead stores", len(removed))
    return removed


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """One ``mmap(2)`` region, unmapped when the last array viewing it is gone."""

    def __init__(self, addr: int, nbytes: int) -> None:
        self.addr, self.nbytes = addr, nbytes

    def __del__(self) -> None:
        _libc.munmap(self.addr, self.nbytes)


def _map(path: Path, dtype: np.dtype, shape: tuple[int, ...], writable: bool) -> np.ndarray:
    """Map ``path`` as an array. The file descriptor is closed once mapped: Python's
    ``mmap`` keeps a duplicate open per mapping, so a store with 226 tensors hit
    ``ulimit -n 256``; ``mmap(2)`` through libc keeps none."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise StoreError(f"shared memory {path}: cannot open ({exc.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        if size < nbytes:
            raise StoreError(f"shared memory {path}: {size} bytes, expected {nbytes}")
        # MAP_POPULATE maps every page now, so the first pulls pay no page faults
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mflags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        addr = _libc.mmap(None, nbytes, prot, mflags, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise StoreError(f"shared memory {path}: cannot map ({os.strerror(err)})")
    finally:
        os.close(fd)
    buf = (ctypes.c_char * nbytes).from_address(addr)
    buf._graphrun_mapping = _Mapping(addr, nbytes)  # type: ignore[attr-defined]
    arr = np.frombuffer(memoryview(buf), dtype=dtype).reshape(shape)
    if not writable:
        arr.flags.writeable = False
    return arr


def attach(
    shm_dir: Path, segment: str, dtype: str | np.dtype, shape: tuple[int, ...], writable: bool
) -> np.ndarray:
    """Map an existing segment as an array (read-only unless ``writable``). ``segment`` must
    be a graphrun segment name (no path): nothing outside ``shm_dir`` is ever mapped."""
    if not isinstance(segment, str) or not _NAME.fullmatch(segment):
        raise StoreError(f"shared memory: {segment!r} is not a graphrun segment name")
    return _map(Path(shm_dir) / segment, np.dtype(dtype), tuple(shape), writable)


def free_bytes(shm_dir: Path) -> int:
    st = os.statvfs(shm_dir)
    return st.f_bavail * st.f_frsize


def no_space(shm_dir: Path, needed: int) -> StoreError:
    return StoreError(
        f"shared memory {shm_dir}: {needed} bytes needed, {free_bytes(shm_dir)} free "
        "(a bigger /dev/shm, --shm-dir elsewhere, or more partitions)"
    )


def check_space(shm_dir: Path, needed: int) -> None:
    """StoreError naming the directory, the bytes needed and free, if they do not fit."""
    if needed > free_bytes(shm_dir):
        raise no_space(shm_dir, needed)


@dataclass
class SegmentStore:
    """The segments one store instance creates; unlinks them all on :meth:`close`."""

    shm_dir: Path = DEFAULT_SHM_DIR
    prefix: str = field(default_factory=instance_prefix)
    created: dict[str, Path] = field(default_factory=dict)
    _seq: Iterator[int] = field(default_factory=itertools.count)  # next(): thread-safe

    def create(self, dtype: str | np.dtype, shape: tuple[int, ...]) -> tuple[str, np.ndarray]:
        """A new zero-filled segment; returns its name and a writable array on it."""
        dt = np.dtype(dtype)
        name = f"{self.prefix}.{next(self._seq)}"  # a compaction thread creates too
        path = Path(self.shm_dir) / name
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise StoreError(f"shared memory {path}: cannot create ({exc.strerror})") from None
        try:
            # allocate now: a sparse file on a full tmpfs is a SIGBUS at the first write
            if nbytes:
                os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            os.unlink(path)
            if exc.errno == errno.ENOSPC:
                raise no_space(self.shm_dir, nbytes) from None
            raise StoreError(f"shared memory {path}: cannot allocate ({exc.strerror})") from None
        finally:
            os.close(fd)
        self.created[name] = path
        return name, _map(path, dt, tuple(shape), writable=True)

    def copy_in(self, arr: np.ndarray) -> tuple[str, np.ndarray]:
        """A new segment holding a copy of ``arr`` (read from disk if memory-mapped)."""
        name, out = self.create(arr.dtype, arr.shape)
        if arr.size:
            out[...] = arr
        return name, out

    def unlink(self, name: str) -> None:
        path = self.created.pop(name, None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        for name in list(self.created):
            self.unlink(name)


def host_identity(shm_dir: Path) -> dict[str, str]:
    """Identifies the machine (kernel) and shared-memory filesystem of this process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        dev = str(os.stat(shm_dir).st_dev)
    except OSError:
        dev = ""
    return {"hostname": socket.gethostname(), "boot_id": boot, "shm_dev": dev}


def host_digest(identity: dict[str, str]) -> dict[str, str]:
    """What a job key learns of a server's :func:`host_identity`: a hash that proves "same
    kernel boot and shared-memory device" to a client that hashes its own, and does not
    tell the host name or boot id (the boot id is 128 random bits: not guessable)."""
    text = json.dumps(identity, sort_keys=True)
    return {"digest": hashlib.sha256(text.encode()).hexdigest()}


def same_host(server: dict[str, str], shm_dir: Path) -> bool:
    """Whether a server's host identity (full, or its :func:`host_digest`) is this one's."""
    mine = host_identity(shm_dir)
    return server == (host_digest(mine) if "digest" in server else mine)
