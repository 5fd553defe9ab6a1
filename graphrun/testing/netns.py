"""Two "hosts" on one machine: network namespaces joined by a veth pair (needs root).

    from graphrun.testing.netns import netns_available, host_pair

    if netns_available():
        with host_pair() as (a, b):          # a.ns, a.ip ("10.77.N.1"), b.ns, b.ip
            store = start_store(parts, 0, address=f"tcp://{a.ip}:0", launcher=a.exec_prefix)
            subprocess.run([*b.exec_prefix, sys.executable, ...])

Each namespace has its own network stack (loopback included); only the veth link
joins them, with 10.77.N.0/24 addresses that exist only inside these namespaces.
The namespaces (and with them the veth pair) are deleted on exit. They share the
file system, so ``/dev/shm`` is still visible: force the network path in clients
(``use_shm=False``) when that matters.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

_counter = itertools.count()


@dataclass(frozen=True)
class Host:
    ns: str
    ip: str

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it inside the namespace."""
        return ["ip", "netns", "exec", self.ns]


def netns_available() -> bool:
    """Root and the ``ip`` tool: network namespaces can be created here."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def host_pair(tag: str = "gr") -> Iterator[tuple[Host, Host]]:
    """Two namespaces ``<tag>-a-<id>``/``<tag>-b-<id>`` linked by one veth pair."""
    uid = f"{os.getpid() % 10000}{next(_counter)}"
    sub = (os.getpid() + int(uid)) % 250 + 1
    a = Host(f"{tag}-a-{uid}", f"10.77.{sub}.1")
    b = Host(f"{tag}-b-{uid}", f"10.77.{sub}.2")
    va, vb = f"v{tag}a{uid}"[:15], f"v{tag}b{uid}"[:15]
    created: list[str] = []
    try:
        for h in (a, b):
            _ip("netns", "add", h.ns)
            created.append(h.ns)
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a.ns)
        _ip("link", "set", vb, "netns", b.ns)
        for h, dev in ((a, va), (b, vb)):
            _ip("-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", dev)
            _ip("-n", h.ns, "link", "set", dev, "up")
            _ip("-n", h.ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in created:  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
