"""What one host can do, measured on it: ``python -m graphrun.measure.host WHAT ...``.

The pieces :mod:`graphrun.measure.probe` runs on every host (through the host's command
prefix, e.g. its network namespace), each printing one JSON line:

``cpu [--seconds S]``
    effective cores: one busy process per core of the machine, all timed over the same
    ``S`` seconds (after they started and spun a while); the CPU time they get, over
    ``S``, is what the host's share allows (a cgroup quota, other load). Also the time
    of a fixed sampling + training kernel on one core, so hosts of different speed show
    as such.
``memory``
    bytes the host may use: the smallest of ``MemTotal`` and the memory cgroup's limit.
``sink --bind ADDR --port P --step K`` / ``send --to ADDR:P --step K [--seconds S]``
    bandwidth: the sender streams 1 MiB writes for ``S`` seconds, the sink reports the
    steady rate it received at (after the first 30 % of the transfer's time).
``echo --bind ADDR --port P --step K`` / ``ping --to ADDR:P --step K [--count N]``
    latency: the median round trip of 64-byte messages, halved.

The servers (``sink``, ``echo``) listen on ``ADDR`` only and measure one connection: the
client's that opens with a header of step ``K`` tagged with the probe's key
(``$GRAPHRUN_PROBE_KEY``, hex: :mod:`graphrun.measure.auth`), and they answer it with a
tagged go. Connections are accepted and their headers read all at once, each within its
own few seconds, anything else closed unanswered: a stranger on the port neither holds
a server up nor takes the client's place. Every wait ends at ``--timeout``.

The same pieces work on a connection already open (``receive_stream``/``send_stream``,
``echo_back``/``ping_peer``): the Kubernetes probe's members (:mod:`graphrun.measure.member`)
measure both over one connection to each peer.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graphrun.arguments import OneLineParser, integer, number
from graphrun.errors import ProbeAuthError
from graphrun.measure.auth import BACKLOG, KEY_ENV, Acceptor, hello, left, parse_key, say_go

CHUNK = 1 << 20
PING_BYTES = 64


START_S = 0.5  # the workers start spinning this long after they are forked ...
WARM_S = 0.3  # ... and are timed from this long after that


def _burn(start: float, seconds: float, out: Any) -> None:
    """Spin from ``start`` (``time.monotonic``: one clock for every process) for
    :data:`WARM_S` + ``seconds``; put the CPU time this process got in the last
    ``seconds``."""
    while time.monotonic() < start:
        time.sleep(min(0.01, max(0.0, start - time.monotonic())))
    while time.monotonic() < start + WARM_S:
        pass
    c0 = time.process_time()
    while time.monotonic() < start + WARM_S + seconds:
        pass
    out.put(time.process_time() - c0)


def effective_cores(seconds: float = 1.0, workers: int | None = None) -> float:
    """CPU time that ``workers`` busy processes get per second of wall time.

    Every worker is timed over the same window. It opens after the workers were forked
    (under a CPU quota the forks themselves wait: timed from the first fork, a 0.6-core
    host read 0.57) and after they have spun for a while (a quota left unspent while
    they slept would let the window's first period run unthrottled: 0.61-0.67). A
    window of whole quota periods (100 ms) then holds exactly their share."""
    workers = workers or os.cpu_count() or 1
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start = time.monotonic() + START_S
    procs = [ctx.Process(target=_burn, args=(start, seconds, q)) for _ in range(workers)]
    for p in procs:
        p.start()
    cpu = sum(q.get(timeout=START_S + WARM_S + seconds + 30) for _ in procs)
    for p in procs:
        p.join(timeout=10)
    return cpu / seconds


def kernel_seconds(rounds: int = 3) -> float:
    """Best-of-``rounds`` time of a fixed neighbour-sampling + dense step on one core."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    indptr = np.arange(0, 20_001 * 20, 20, dtype=np.int64)
    indices = rng.integers(0, 20_000, 20_000 * 20)
    w = torch.randn(128, 128)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        seeds = rng.integers(0, 20_000, 2_000)
        picks = indptr[seeds, None] + rng.integers(0, 20, (2_000, 10))
        x = torch.randn(len(indices[picks].ravel()), 128)
        (x @ w).relu_().sum()
        best = min(best, time.perf_counter() - t0)
    return best


def memory_bytes(own_limit: bool = True) -> int:
    """The smallest of MemTotal and this process's memory cgroup limit (v1 or v2); with
    ``own_limit=False`` MemTotal alone (a probe pod's limit is its own, not its node's)."""
    total = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    if not own_limit:
        return total
    limits = [total]
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for f in (
            Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.limit_in_bytes",
            Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.max",
        ):
            if ("memory" in names.split(",") or names == "") and f.is_file():
                text = f.read_text().strip()
                if text.isdigit():
                    limits.append(int(text))
    return min(limits)


SERVE_SECONDS = 60.0  # a server's deadline: the client's header, and the measurement


def _serve(bind: str, port: int, key: bytes, step: int, timeout: float) -> socket.socket:
    """Listen on ``bind``; the connection whose header is ``step``'s, tagged with ``key``,
    after saying go, with ``timeout``'s deadline on it (strangers closed unanswered)."""
    deadline = time.monotonic() + timeout
    with socket.create_server((bind, port), backlog=BACKLOG) as srv:
        print(json.dumps({"up": True}), flush=True)
        with Acceptor(srv, key, step + 1) as acceptor:
            got = acceptor.take(step, deadline)
    if got is None:
        raise ProbeAuthError(f"no client with the probe's key came within {timeout:g}s")
    got.conn.settimeout(left(deadline))
    say_go(got.conn, key, got.header)
    return got.conn


def _open(to: str, key: bytes, step: int, count: int) -> socket.socket:
    """Connect to the server at ``to`` and show the key; ProbeAuthError if its go lacks it."""
    host, port = to.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=30)
    try:
        if hello(conn, key, step, 0, count) is None:
            raise ProbeAuthError(f"{to} did not say go with the probe's key")
    except BaseException:
        conn.close()
        raise
    return conn


def sink(
    bind: str, port: int, key: bytes, step: int = 0, timeout: float = SERVE_SECONDS
) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    with _serve(bind, port, key, step, timeout) as conn:
        return receive_stream(conn, deadline)


MAX_MARKS = 4096  # arrival marks a stream keeps (past it: every other one, twice as sparse)


def receive_stream(conn: socket.socket, until: float = math.inf) -> dict[str, float]:
    """Read ``conn`` until the sender shuts its side; the bytes and the steady rate.
    TimeoutError past ``until`` (``time.monotonic``): a sender never stops by itself."""
    n = 0
    marks: list[tuple[float, int]] = []  # (arrival time, bytes so far), at most MAX_MARKS
    gap = 0.001  # the least time between two marks
    last = (0.0, 0)
    buf = bytearray(CHUNK)
    while True:
        k = conn.recv_into(buf)
        if not k:
            break
        n += k
        now = time.monotonic()
        if now > until:
            raise TimeoutError("the stream went on past its deadline")
        last = (now, n)
        if not marks or now - marks[-1][0] >= gap:
            marks.append(last)
        if len(marks) >= MAX_MARKS:
            marks, gap = marks[::2], 2 * gap
    if marks and marks[-1] != last:
        marks.append(last)
    return {"bytes": n, "bytes_per_s": steady_rate(marks)}


def steady_rate(marks: Sequence[tuple[float, int]], warmup: float = 0.3) -> float:
    """Bytes per second after the first ``warmup`` share of the transfer's time: slow
    start, and a shaper's first drops (a 200 ms retransmission timeout), are not the
    link's rate that a long transfer (a feature pull stream) sees."""
    if len(marks) < 2:
        return 0.0
    t0, t1 = marks[0][0], marks[-1][0]
    cut = t0 + warmup * (t1 - t0)
    i = next(i for i, (t, _) in enumerate(marks) if t >= cut)
    i = min(i, len(marks) - 2)
    dt = t1 - marks[i][0]
    return (marks[-1][1] - marks[i][1]) / dt if dt > 0 else 0.0


def send(to: str, seconds: float, key: bytes, step: int = 0) -> dict[str, float]:
    with _open(to, key, step, 0) as c:
        return {"bytes": send_stream(c, seconds)}


def send_stream(conn: socket.socket, seconds: float) -> int:
    """Write 1 MiB chunks to ``conn`` for ``seconds``; the bytes sent."""
    data = b"\0" * CHUNK
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        conn.sendall(data)
        n += CHUNK
    return n


def echo(
    bind: str, port: int, key: bytes, step: int = 0, timeout: float = SERVE_SECONDS
) -> dict[str, bool]:
    deadline = time.monotonic() + timeout
    with _serve(bind, port, key, step, timeout) as conn:
        echo_back(conn, until=deadline)
    return {"done": True}


def echo_back(conn: socket.socket, total: int | None = None, until: float = math.inf) -> None:
    """Send back what arrives on ``conn``: until the peer closes, or ``total`` bytes;
    TimeoutError past ``until`` (``time.monotonic``)."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    left = math.inf if total is None else total
    while left > 0:
        msg = conn.recv(int(min(PING_BYTES, left)))
        if not msg:
            break
        if time.monotonic() > until:
            raise TimeoutError("the echo went on past its deadline")
        conn.sendall(msg)
        left -= len(msg)


def ping(to: str, count: int, key: bytes, step: int = 0) -> dict[str, float]:
    with _open(to, key, step, count) as c:
        return {"latency_s": ping_peer(c, count)}


def ping_peer(conn: socket.socket, count: int) -> float:
    """Half the median round trip of ``count`` 64-byte messages an echo sends back."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(count):
        t0 = time.perf_counter()
        conn.sendall(b"x" * PING_BYTES)
        got = 0
        while got < PING_BYTES:
            k = len(conn.recv(PING_BYTES - got))
            if not k:
                raise ConnectionError("the echo closed the connection")
            got += k
        rtts.append(time.perf_counter() - t0)
    return statistics.median(rtts) / 2


#: bounds of the command line (a probe's longest phase is minutes, never days)
SECONDS = number(0, 3600, above=True)
STEP = integer(0, 1 << 20)


def main(argv: Sequence[str] | None = None) -> int:
    p = OneLineParser(prog="python -m graphrun.measure.host", description=__doc__)
    sub = p.add_subparsers(dest="what", required=True)
    cpu = sub.add_parser("cpu")
    cpu.add_argument("--seconds", type=SECONDS, default=1.0)
    sub.add_parser("memory")
    for name in ("sink", "echo"):
        s = sub.add_parser(name)
        s.add_argument("--bind", required=True)
        s.add_argument("--port", type=integer(0, 65535), required=True)
        s.add_argument("--step", type=STEP, default=0)
        s.add_argument("--timeout", type=SECONDS, default=SERVE_SECONDS)
    snd = sub.add_parser("send")
    snd.add_argument("--to", required=True)
    snd.add_argument("--step", type=STEP, default=0)
    snd.add_argument("--seconds", type=SECONDS, default=1.0)
    png = sub.add_parser("ping")
    png.add_argument("--to", required=True)
    png.add_argument("--step", type=STEP, default=0)
    png.add_argument("--count", type=integer(1, 10_000), default=50)
    a = p.parse_args(argv)
    key = b""
    if a.what in ("sink", "echo", "send", "ping"):
        try:
            key = parse_key(os.environ.get(KEY_ENV, ""))
        except ValueError as exc:
            print(f"measure {a.what}: {exc} (the probe's key, hex)", file=sys.stderr)
            return 2
    out: dict[str, Any]
    try:
        if a.what == "cpu":
            out = {"cores": effective_cores(a.seconds), "kernel_s": kernel_seconds()}
        elif a.what == "memory":
            out = {"bytes": memory_bytes()}
        elif a.what == "sink":
            out = sink(a.bind, a.port, key, a.step, a.timeout)
        elif a.what == "send":
            out = send(a.to, a.seconds, key, a.step)
        elif a.what == "echo":
            out = echo(a.bind, a.port, key, a.step, a.timeout)
        else:
            out = ping(a.to, a.count, key, a.step)
    except OSError as exc:  # a timeout, a refused connection, a peer without the key
        print(f"measure {a.what}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
