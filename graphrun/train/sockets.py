"""The TCP connections of a process group, shut when an elastic trainer abandons it.

gloo closes a group's connections only when the group is freed, and DDP keeps every
group it was built on alive for the life of the process (``destroy_process_group``,
``ProcessGroup.abort`` and ``shutdown`` close nothing then). So when a machine is lost,
the survivor that notices first leaves for the re-form while its connections stay
open, and a survivor blocked in a receive *from it* (not from the dead machine: gloo
fails only the operations on the broken connection) waits the whole collective timeout,
then the re-form's timeout settle time: 2 x 60 s by default (docs/elastic.md).

:func:`opened` notes the sockets a group's ``init_process_group`` opens (each by file
descriptor and inode, so a number reused later is never taken for one of them);
:func:`shut` shuts the connected ones down (``SHUT_RDWR``: the peer reads the end of
the stream at once, its pending operations fail with "Connection closed"). The
descriptors stay gloo's: only the connection ends. Listening sockets are left alone.
A socket another thread opened during the init (a store client reconnecting) is noted
too; shut, it is connected again (ZeroMQ does that by itself). The rendezvous store's
are not noted (its port is known).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterable, Iterator

# where a process lists its open descriptors (Linux and macOS)
_FD_DIR = "/dev/fd"


def _sockets() -> set[tuple[int, int]]:
    """This process's open sockets: ``(descriptor, inode)``."""
    out = set()
    for name in os.listdir(_FD_DIR):
        try:
            st = os.fstat(int(name))
        except (ValueError, OSError):  # the listing's own descriptor, closed since
            continue
        if stat.S_ISSOCK(st.st_mode):
            out.add((int(name), st.st_ino))
    return out


def port_of(address: str) -> int | None:
    """The port of a ``host:port`` rendezvous (the CURVE store's); None for a URL."""
    port = address.rpartition(":")[2]
    return int(port) if "://" not in address and port.isdigit() else None


def _ports(fd: int) -> set[int]:
    """The local and the remote port of socket ``fd`` (none that it has not)."""
    out: set[int] = set()
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return out
    with sock:
        for name in (sock.getsockname, sock.getpeername):
            with contextlib.suppress(OSError, TypeError, IndexError, ValueError):
                out.add(int(name()[1]))
    return out


@contextlib.contextmanager
def opened(into: set[tuple[int, int]], rendezvous_port: int | None = None) -> Iterator[None]:
    """Add to ``into`` the sockets opened while the block runs (a group's init: gloo
    connects every pair of ranks there), but none on ``rendezvous_port``: the CURVE
    rendezvous's connections (a trainer reconnecting to it, trainer 0 serving it) stay
    up, and with them its requests, which are not all safe to send twice."""
    before = _sockets()
    try:
        yield
    finally:
        new = _sockets() - before
        if rendezvous_port is not None:
            new = {(fd, ino) for fd, ino in new if rendezvous_port not in _ports(fd)}
        into.update(new)


def shut(sockets: Iterable[tuple[int, int]]) -> int:
    """Shut down the TCP connections among ``sockets`` that are still open (same
    descriptor, same inode); returns how many."""
    done = 0
    for fd, inode in sockets:
        try:
            if os.fstat(fd).st_ino != inode:
                continue  # closed, and the number given to another file since
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock, contextlib.suppress(OSError):  # closes the duplicate only
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.type != socket.SOCK_STREAM:
                continue
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue  # a listener
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
    return done
