"""One member of the Kubernetes probe: ``graphrun probe --member I --peers A0,A1,...``.

The probe Job (:mod:`graphrun.operator.probe`) runs one member per node. Member ``I``
listens on the port of ``A_I``, measures its own node (effective cores, the fixed
kernel's time, the node's memory: :mod:`graphrun.measure.host`), then measures links
with the others in the steps of :func:`schedule`, a round-robin tournament: in every
step each member sends to at most one peer or receives from at most one, so each link
is measured alone, and every ordered pair is measured exactly once. A member alone
measures itself over loopback, as ``graphrun probe`` does one host.

One TCP connection per pair, the sender's::

    sender   -> receiver   HEADER: magic "GRPB", step, sender index, ping count (!4sIII),
                           and its tag
    receiver -> sender     "G" and a tag, once the receiver has reached that step
                           (connections of later steps wait, parked, until it does)
    sender  <-> receiver   count 64-byte pings echoed (the latency: half the median)
    sender   -> receiver   1 MiB writes for --seconds, then the sender shuts its side
    receiver -> sender     JSON {"bytes", "bytes_per_s"} (the steady rate it received)
                           and its tag (at most ANSWER_LIMIT bytes read)

A tag is HMAC-SHA256 under the probe's key (32 random bytes the CLI puts in a Secret;
the pods read it from ``$GRAPHRUN_PROBE_KEY``) of the message's role, the header and the
message, so no one without the key can take a member's place, answer for one, or
replay another step's messages; a connection whose header does not verify is closed
unanswered. Connections are accepted and their headers read all at once, each within its
own :data:`~graphrun.measure.auth.HEADER_SECONDS` (at most
:data:`~graphrun.measure.auth.MAX_PENDING` waiting, the oldest closed first), so idle
strangers on the port never hold up a member (:mod:`graphrun.measure.auth`). The
measuring bytes (pings, the stream) are not tagged: they carry nothing.

Every wait (a peer's pod starting, its DNS name resolving, the go, the answer) ends at
the member's deadline; a member that gives up on a peer raises :class:`PeerLost` (the
CLI exits :data:`graphrun.errors.PEER_LOST_EXIT`, so the member that failed first is
blamed). The result is a :class:`MemberReport`, written as compact JSON to the pod's
termination message (at most :data:`MESSAGE_LIMIT` bytes, checked).
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
from dataclasses import dataclass

from graphrun.errors import GraphrunError, HostError, PeerLost
from graphrun.measure import host as measure
from graphrun.measure.auth import (  # noqa: F401 (the members' names for the shared ones)
    BACKLOG,
    HEADER,
    KEY_BYTES,
    KEY_ENV,
    MAGIC,
    MAX_PENDING,
    TAG,
    Acceptor,
    hello,
    left,
    parse_key,
    recv_exactly,
    say_go,
    tag,
)
from graphrun.names import Endpoint

MESSAGE_LIMIT = 4096  # bytes Kubernetes keeps of a termination message
REPORT_VERSION = 1
ANSWER_LIMIT = 4096  # bytes of a receiver's answer, tag included
STREAM_SLACK_S = 30.0  # a sender's stream may last this longer than --seconds


def schedule(n: int) -> list[list[tuple[int, int]]]:
    """Steps of ``(sender, receiver)`` pairs over ``n`` members: every ordered pair
    exactly once, no member in two pairs of one step. The circle method's ``n - 1``
    rounds (``n`` with a bye when ``n`` is odd), each taken one way, then the other."""
    if n < 1:
        raise ValueError(f"schedule: needs a member, got {n}")
    if n == 1:
        return [[(0, 0)]]
    ring: list[int | None] = [*range(n), *([None] if n % 2 else [])]
    m = len(ring)
    steps = []
    for _ in range(m - 1):
        pairs = [(ring[k], ring[m - 1 - k]) for k in range(m // 2)]
        there = [(a, b) for a, b in pairs if a is not None and b is not None]
        steps += [there, [(b, a) for a, b in there]]
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return steps


@dataclass(frozen=True)
class MemberReport:
    """What member ``index`` measured: its node, and each link it sent on as
    ``(peer index, bytes per second, one-way latency in seconds)``."""

    index: int
    cores: float
    kernel_s: float
    memory_bytes: int
    links: tuple[tuple[int, float, float], ...]

    def to_message(self) -> str:
        """Compact JSON for the termination message; :class:`HostError` when it would
        not fit in :data:`MESSAGE_LIMIT` bytes (too many members for one message)."""
        text = json.dumps(
            {
                "v": REPORT_VERSION,
                "i": self.index,
                "cores": round(self.cores, 3),
                "kernel_s": round(self.kernel_s, 5),
                "mem": self.memory_bytes,
                "to": [[j, round(rate), round(lat, 7)] for j, rate, lat in self.links],
            },
            separators=(",", ":"),
        )
        if len(text.encode()) > MESSAGE_LIMIT:
            raise HostError(
                f"probe member {self.index}: its report is {len(text.encode())} bytes, more "
                f"than the {MESSAGE_LIMIT} a termination message holds ({len(self.links)} "
                "links): probe fewer nodes at once"
            )
        return text

    @classmethod
    def from_message(cls, text: str, where: str) -> MemberReport:
        """Parse a termination message; :class:`HostError` naming ``where`` if it is not
        a report of this version."""
        try:
            data = json.loads(text)
            if data.get("v") != REPORT_VERSION:
                raise ValueError(f"version {data.get('v')!r}, expected {REPORT_VERSION}")
            links = tuple((int(j), float(r), float(t)) for j, r, t in data["to"])
            return cls(
                int(data["i"]), float(data["cores"]), float(data["kernel_s"]),
                int(data["mem"]), links,
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            shown = " ".join(text.split())[:120]
            raise HostError(
                f"{where}: the termination message is not a probe report ({exc}): {shown!r}"
            ) from None


@dataclass(frozen=True)
class MemberConfig:
    """Member ``index`` of ``peers`` (``(host, port)`` of every member, in index order)."""

    index: int
    peers: tuple[tuple[str, int], ...]
    key: bytes  # the probe's key: every member's messages are tagged with it
    seconds: float = 1.0
    timeout: float = 600.0
    bind: str = "0.0.0.0"
    ping_count: int = 50


def run_member(cfg: MemberConfig) -> MemberReport:
    """Measure this node, then every link of the schedule this member takes part in."""
    deadline = time.monotonic() + cfg.timeout
    n = len(cfg.peers)
    with socket.create_server((cfg.bind, cfg.peers[cfg.index][1]), backlog=BACKLOG) as srv:
        cores = measure.effective_cores(cfg.seconds)  # peers connecting now wait for the go
        kernel_s = measure.kernel_seconds()
        memory = measure.memory_bytes(own_limit=False)
        links = []
        steps = schedule(n)
        with Acceptor(srv, cfg.key, len(steps)) as acceptor:
            for step, pairs in enumerate(steps):
                for a, b in pairs:
                    if a == b == cfg.index:
                        links.append(_to_self(cfg, acceptor, step, deadline))
                    elif a == cfg.index:
                        links.append(_send(cfg, step, b, deadline))
                    elif b == cfg.index:
                        _receive(cfg, acceptor, step, a, deadline)
    return MemberReport(cfg.index, cores, kernel_s, memory, tuple(links))


def _send(cfg: MemberConfig, step: int, peer: int, deadline: float) -> tuple[int, float, float]:
    """Measure the link to ``peer``: latency, then rate (the receiver's)."""
    host, port = cfg.peers[peer]
    what = f"probe member {cfg.index}: member {peer} ({host}:{port})"
    conn = _connect(host, port, deadline, what)
    try:
        with conn:
            conn.settimeout(left(deadline))
            header = hello(conn, cfg.key, step, cfg.index, cfg.ping_count)
            if header is None:
                raise PeerLost(f"{what} did not say go with the probe's key in step {step}")
            conn.settimeout(left(deadline))
            latency = measure.ping_peer(conn, cfg.ping_count)
            measure.send_stream(conn, cfg.seconds)
            conn.shutdown(socket.SHUT_WR)
            raw = _recv_all(conn, ANSWER_LIMIT)
            body, got = raw[:-TAG], raw[-TAG:]
            if len(raw) <= TAG or not hmac.compare_digest(got, tag(cfg.key, b"ans", header, body)):
                raise PeerLost(f"{what} answered without the probe's key in step {step}")
            answer = json.loads(body)
    except (OSError, ValueError) as exc:  # socket.timeout is an OSError
        raise PeerLost(f"{what}: {exc or type(exc).__name__} in step {step}") from None
    if not isinstance(answer, dict) or "bytes_per_s" not in answer:
        raise PeerLost(f"{what} gave no rate in step {step}")
    return peer, float(answer["bytes_per_s"]), latency


def _connect(host: str, port: int, deadline: float, what: str) -> socket.socket:
    """Connect, retrying while the peer's pod starts (refused, or its name not there yet)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=min(5.0, left(deadline)))
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise PeerLost(f"{what}: no connection ({exc})") from None
            time.sleep(min(0.5, left(deadline)))


def _receive(
    cfg: MemberConfig, acceptor: Acceptor, step: int, sender: int, deadline: float
) -> None:
    """Serve ``sender``'s connection of ``step`` (parked by ``acceptor``)."""
    what = f"probe member {cfg.index}: member {sender}"
    got = acceptor.take(step, deadline)
    if got is None:
        raise PeerLost(f"{what} did not connect in step {step}")
    with got.conn as conn:
        if got.sender != sender:
            raise HostError(f"{what} was expected in step {step}, member {got.sender} came")
        try:
            conn.settimeout(left(deadline))
            say_go(conn, cfg.key, got.header)
            measure.echo_back(conn, got.count * measure.PING_BYTES, deadline)
            until = min(deadline, time.monotonic() + cfg.seconds + STREAM_SLACK_S)
            rate = measure.receive_stream(conn, until)
            body = json.dumps(rate).encode()
            conn.sendall(body + tag(cfg.key, b"ans", got.header, body))
        except OSError as exc:
            raise PeerLost(f"{what} broke off in step {step} ({exc})") from None


def _to_self(
    cfg: MemberConfig, acceptor: Acceptor, step: int, deadline: float
) -> tuple[int, float, float]:
    """A member alone: its receiving side in a thread, its sending side here."""
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            _receive(cfg, acceptor, step, cfg.index, deadline)
        except GraphrunError as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    link = _send(cfg, step, cfg.index, deadline)
    thread.join(left(deadline))
    if errors:
        raise errors[0]
    return link


def _recv_all(conn: socket.socket, limit: int) -> bytes:
    """Everything until the peer closes; ValueError past ``limit`` bytes."""
    out = b""
    while chunk := conn.recv(limit + 1 - len(out)):
        out += chunk
        if len(out) > limit:
            raise ValueError(f"an answer of more than {limit} bytes")
    return out


def parse_peers(text: str, where: str = "--peers") -> tuple[tuple[str, int], ...]:
    """``host:port,host:port,...`` → ``((host, port), ...)``; ValueError naming the item."""
    peers = []
    for k, item in enumerate(p.strip() for p in text.split(",")):
        try:
            peer = Endpoint.parse(item)
        except ValueError:
            raise ValueError(f"{where}: item {k} {item!r} is not HOST:PORT") from None
        peers.append((peer.host, peer.port))
    return tuple(peers)
