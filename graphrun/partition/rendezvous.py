"""Where the ranks of the distributed partition mode meet (the c10d rendezvous), checked.

==================  ====================================================================
``file://PATH``     every rank on one host: a file store. :func:`private_rendezvous`
                    makes one in a fresh directory only this user can open (0700), as
                    ``graphrun run`` does in its run directory; nothing listens.
``tcp://HOST:PORT`` ranks on several hosts: rank 0 serves the store on HOST's address
                    only (never on every interface, where torch's own TCP rendezvous
                    listens), the other ranks connect to it.
==================  ====================================================================

The partition ranks (``--rendezvous``) and the trainers (``hosts.json``'s
``rendezvous``, :mod:`graphrun.train.ddp`) meet this way. The store is not
authenticated (torch offers no authenticated rendezvous): SECURITY.md says what
protects a TCP one. Every wait is bounded by ``timeout``: a rendezvous that
never answers, or ranks that never all arrive, end in one line naming the rendezvous.
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from graphrun.errors import ArgumentError, GraphrunError, PeerLost

if TYPE_CHECKING:
    from torch.distributed import Store

FLAG = "--rendezvous"


@dataclass(frozen=True)
class Rendezvous:
    """A parsed ``--rendezvous``: ``file`` (``path``) or ``tcp`` (``host``, ``port``)."""

    url: str
    scheme: str
    path: str = ""
    host: str = ""
    port: int = 0
    flag: str = FLAG  # where it was given, for messages


def parse_rendezvous(url: str, flag: str = FLAG) -> Rendezvous:
    """``url`` checked: ``tcp://HOST:PORT`` or ``file://PATH``, else an ArgumentError
    naming ``flag``."""
    usage = f"{flag}: {url!r} is not tcp://HOST:PORT (rank 0's address) or file://PATH"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ArgumentError(f"{usage} ({exc})") from None
    if parts.scheme == "file":
        path = parts.netloc + parts.path
        if not path or path.endswith("/"):
            raise ArgumentError(f"{usage}: no file named")
        return Rendezvous(url, "file", path=path, flag=flag)
    if parts.scheme == "tcp":
        if not parts.hostname or port is None or not 0 < port < 65536:
            raise ArgumentError(f"{usage}: needs a host and a port in 1..65535")
        if parts.path or parts.query or parts.username:
            raise ArgumentError(f"{usage}: nothing may follow HOST:PORT")
        return Rendezvous(url, "tcp", host=parts.hostname, port=port, flag=flag)
    raise ArgumentError(usage)


@contextlib.contextmanager
def private_rendezvous() -> Iterator[str]:
    """A ``file://`` rendezvous in a fresh directory of mode 0700, removed after."""
    d = Path(tempfile.mkdtemp(prefix="graphrun-rendezvous-"))  # 0700
    try:
        yield f"file://{d / 'store'}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def gloo_interface(rdv: Rendezvous) -> str | None:
    """The network interface gloo should listen on for ``rdv`` (where nothing else says):
    loopback for a ``file://`` one (one host), the interface this host reaches rank 0
    through for a ``tcp://`` one; None when it cannot be told."""
    import psutil

    if rdv.scheme == "file":
        return next((n for n, st in psutil.net_if_stats().items() if n == "lo" and st.isup), None)
    try:
        family, _, _, _, addr = socket.getaddrinfo(rdv.host, rdv.port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)  # UDP: no packet sent, only the route chosen
            local = s.getsockname()[0]
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == local for a in addrs):
            return name
    return None


def join(rdv: Rendezvous, rank: int, world: int, timeout: float, backend: str = "gloo") -> None:
    """Initialise ``torch.distributed`` (``backend``) as ``rank`` of ``world`` at ``rdv``,
    waiting at most ``timeout`` seconds for the others."""
    import torch.distributed as dist

    td = datetime.timedelta(seconds=timeout)
    if rdv.scheme == "file":
        _init(rdv, rank, world, timeout, backend, init_method=rdv.url)
        return
    deadline = time.monotonic() + timeout
    if rank == 0:
        listener = _listen(rdv)
        try:
            store = dist.TCPStore(
                rdv.host, rdv.port, world, True, td, wait_for_workers=False,
                master_listen_fd=listener.detach(),
            )  # fmt: skip
        except RuntimeError as exc:
            raise _lost(rdv, rank, world, timeout, exc) from None
    else:
        _wait_reachable(rdv, deadline, timeout)
        left = datetime.timedelta(seconds=max(1.0, deadline - time.monotonic()))
        try:
            store = dist.TCPStore(rdv.host, rdv.port, world, False, left)
        except RuntimeError as exc:
            raise _lost(rdv, rank, world, timeout, exc) from None
    _init(rdv, rank, world, timeout, backend, store=store)


def _init(
    rdv: Rendezvous, rank: int, world: int, timeout: float, backend: str,
    init_method: str | None = None, store: Store | None = None,
) -> None:  # fmt: skip
    import torch.distributed as dist

    try:
        dist.init_process_group(
            backend, init_method, rank=rank, world_size=world, store=store,
            timeout=datetime.timedelta(seconds=timeout),
        )  # fmt: skip
    except (RuntimeError, ValueError) as exc:
        raise _lost(rdv, rank, world, timeout, exc) from None


# what gloo says when a rank that had met this one went away while the mesh was made
_LEFT = ("closed by peer", "reset by peer")


def _lost(rdv: Rendezvous, rank: int, world: int, timeout: float, exc: Exception) -> GraphrunError:
    """The rendezvous' failure: :class:`PeerLost` when another rank met this one and then
    left (it failed first, e.g. refusing its output: it is the one to blame), else a
    rendezvous that did not happen in ``timeout`` seconds."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if any(s in first for s in _LEFT):
        return PeerLost(f"{rdv.flag} {rdv.url}: rank {rank} of {world}: a rank left ({first})")
    return GraphrunError(
        f"{rdv.flag} {rdv.url}: rank {rank} of {world} did not meet the other ranks within "
        f"{timeout:g} s ({first})"
    )


def _listen(rdv: Rendezvous) -> socket.socket:
    """Rank 0's listening socket for the store: HOST's address and PORT, nothing else."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(
            rdv.host, rdv.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise GraphrunError(f"{rdv.flag} {rdv.url}: cannot resolve {rdv.host!r} ({exc})") from None
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
        s.listen(128)
    except OSError as exc:
        s.close()
        raise GraphrunError(
            f"{rdv.flag} {rdv.url}: rank 0 cannot listen on {addr[0]} port {rdv.port} "
            f"({exc.strerror or exc}; HOST must be an address of rank 0's machine)"
        ) from None
    return s


def _wait_reachable(rdv: Rendezvous, deadline: float, timeout: float) -> None:
    """Wait until rank 0's store accepts a connection (quietly: torch's own client
    retries log a C++ stack trace each), at most until ``deadline``."""
    delay, why = 0.1, "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise GraphrunError(
                f"{rdv.flag} {rdv.url}: rank 0 did not answer within {timeout:g} s ({why}; is "
                "rank 0 running, and is HOST:PORT its address?)"
            )
        try:
            with socket.create_connection((rdv.host, rdv.port), timeout=min(left, 5.0)):
                return
        except OSError as exc:
            why = str(exc.strerror or exc)
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(2 * delay, 1.0)
