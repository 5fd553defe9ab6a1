"""A bounded closed-loop HTTP/1.1 load generator on raw asyncio streams.

``clients`` connections, kept alive, each sending one ``POST`` and reading its answer
before the next, until ``requests`` answers or ``seconds`` have passed. A request is a
few bytes formatted into a template; an answer is read by its ``Content-Length``
(bounded: :data:`MAX_ANSWER`), nothing else parsed. httpx, which the bench used before,
spent 7 ms of CPU a request on this box, more than the endpoint it measured (which
shares the box's two cores with it); this one spends a small fraction of that, and the
bench reports both processes' CPU seconds, so requests per CPU-second of the server
are known whatever the box's load.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphrun.errors import ProtocolError

MAX_ANSWER = 64 << 20  # bytes of one answer at most
MAX_HEAD = 64 << 10  # bytes of one answer's status line and headers at most


@dataclass
class Load:
    """What one run measured."""

    latencies: list[float] = field(default_factory=list)  # seconds, of the 200 answers
    errors: int = 0  # answers other than 200, and broken connections
    wall_s: float = 0.0
    client_cpu_s: float = 0.0  # this process's CPU seconds during the run

    def summary(self) -> dict[str, float | int]:
        ms = np.asarray(self.latencies) * 1000 if self.latencies else np.asarray([np.nan])
        return {
            "requests": len(self.latencies), "errors": self.errors,
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "requests_per_s": round(len(self.latencies) / max(self.wall_s, 1e-9), 1),
            "client_cpu_s": round(self.client_cpu_s, 3),
        }  # fmt: skip


def request_bytes(host: str, port: int, path: str, token: str | None, body: bytes) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_answer(reader: asyncio.StreamReader) -> int:
    """The status of one answer, its body read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > MAX_HEAD:
        raise ProtocolError(f"a head of {len(head)} bytes")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"status line {lines[0][:80]!r}")
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length is None or not 0 <= length <= MAX_ANSWER:
        raise ProtocolError(f"Content-Length {length}")
    await reader.readexactly(length)
    return int(parts[1])


async def drive(
    host: str, port: int, path: str, token: str | None, body: Callable[[int], bytes],
    clients: int, requests: int, seconds: float, num_nodes: int, seed: int = 0,
) -> Load:  # fmt: skip
    """``clients`` closed loops, each request ``body(node)`` for a random node."""
    rng = np.random.default_rng(seed)
    load = Load()
    left = requests
    deadline = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while left > 0 and time.perf_counter() < deadline:
                left -= 1
                msg = request_bytes(host, port, path, token, body(int(rng.integers(num_nodes))))
                t0 = time.perf_counter()
                writer.write(msg)
                status = await read_answer(reader)
                if status == 200:
                    load.latencies.append(time.perf_counter() - t0)
                else:
                    load.errors += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ProtocolError):
            load.errors += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    load.wall_s = time.perf_counter() - t0
    load.client_cpu_s = time.process_time() - c0
    return load
