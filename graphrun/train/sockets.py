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
A socket another thread opened during the init (a ZeroMQ client reconnecting) is noted
too; shut, it is connected again (ZeroMQ does that by itself; the rendezvous store's
client retries an unanswered request on a fresh socket).
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


@contextlib.contextmanager
def opened(into: set[tuple[int, int]]) -> Iterator[None]:
    """Add to ``into`` the sockets opened while the block runs (a group's init: gloo
    connects every pair of ranks there)."""
    before = _sockets()
    try:
        yield
    finally:
        into.update(_sockets() - before)


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
