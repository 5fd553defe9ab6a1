"""Fuzzing the store's wire: random and mutated frames from a key holder, garbage from
peers without a key. Bounded in count and time, loopback only, seeded. The server must
stay up, answer a correct client afterwards, and keep its memory and open files flat."""

from __future__ import annotations

import random
import socket
import time

import msgpack
import numpy as np
import psutil
import pytest
import zmq

from graphrun.local.stores import start_stores
from graphrun.rpc.auth import secure_client
from graphrun.rpc.codec import Message, MsgKind, encode
from graphrun.store.client import ClientConfig, KVClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FEAT = "node/_N/feat"
MESSAGES = 1500
SECONDS = 25.0


def _valid(rng: random.Random, session: str) -> list[bytes]:
    ops = ["join", "pull", "push", "init", "attach", "delete", "list", "meta", "heartbeat",
           "sample_neighbors", "graph_find_edges", "graph_edge_types", "graph_changes",
           "graph_out_neighbors", "graph_new_edges", "stats", "nope"]  # fmt: skip
    ids = np.array([rng.randrange(-5, 700) for _ in range(rng.randrange(0, 20))], np.int64)
    body = {"s": session, "job": "fuzz", "name": rng.choice([FEAT, "x", "", "../etc"]),
            "fanout": [rng.randrange(-2, 5)], "seed": rng.randrange(0, 9),
            "since": rng.randrange(-2, 3), "features": rng.choice([[], [FEAT], [1]]),
            "etype": rng.choice([-2, -1, 0, 7, "x"]),
            "missing": rng.choice([True, 1, "x"])}  # fmt: skip
    msg = Message(MsgKind.REQUEST, rng.choice(ops), rng.randrange(0, 2**31), body, (ids,))
    return [bytes(memoryview(f)) for f in encode(msg)]


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = [bytearray(f) for f in frames]
    how = rng.randrange(7)
    if how == 0 and frames[0]:  # flip bytes of the header
        for _ in range(rng.randrange(1, 6)):
            frames[0][rng.randrange(len(frames[0]))] = rng.randrange(256)
    elif how == 1:  # truncate a frame
        i = rng.randrange(len(frames))
        frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)]
    elif how == 2:  # drop or add frames
        frames = frames[:1] if rng.random() < 0.5 else frames + [bytearray(rng.randbytes(64))] * 3
    elif how == 3:  # random bytes
        frames = [bytearray(rng.randbytes(rng.randrange(0, 300)))]
    elif how == 4:  # a header claiming a huge or odd tensor
        hdr = msgpack.unpackb(bytes(frames[0]), raw=False, strict_map_key=False)
        if isinstance(hdr, dict) and hdr.get("t"):
            hdr["t"][0] = [rng.choice(["float64", "object", "int64", "V8", "<f4"]),
                           [rng.choice([2**40, -1, 0, 3])] * rng.randrange(0, 10)]  # fmt: skip
        frames[0] = bytearray(msgpack.packb(hdr))
    elif how == 5:  # a header of another shape altogether
        frames[0] = bytearray(msgpack.packb(rng.choice([[1, 2], "x", {"v": 99}, None, 2**63])))
    return [bytes(f) for f in frames]


def test_fuzzed_frames_leave_the_store_up_and_flat(tmp_path):
    from graphrun.rpc.auth import generate_keys, load_keys
    from graphrun.testing.store import make_partition_dir

    _, parts = make_partition_dir(tmp_path / "parts", 1)
    key_file = tmp_path / "job.key"
    generate_keys(key_file)
    keys = load_keys(key_file)
    rng = random.Random(20261124)
    with start_stores(parts, 1, key_file=key_file, shm_dir=tmp_path) as stores:
        store = stores[0]
        proc = psutil.Process(store.pid)
        address = store.address
        with KVClient(ClientConfig([address], job="fuzz", keys=keys)) as c:  # warm up
            c.pull(FEAT, np.arange(10))
            session = c.session.id
            rss0, fds0 = proc.memory_info().rss, proc.num_fds()
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            secure_client(sock, keys)
            sock.connect(address)
            deadline = time.monotonic() + SECONDS
            sent = 0
            while sent < MESSAGES and time.monotonic() < deadline:
                frames = _valid(rng, session)
                sock.send_multipart(frames if rng.random() < 0.2 else _mutate(rng, frames))
                sent += 1
                while sock.poll(0):
                    sock.recv_multipart()
                if sent % 100 == 0:
                    sock.poll(200)  # let it keep up; replies are read and dropped
            sock.close(0)
            ctx.term()
            host, port = address.removeprefix("tcp://").rsplit(":", 1)
            for _ in range(50):  # peers without a key: garbage, then gone
                with socket.create_connection((host, int(port)), timeout=2) as raw:
                    raw.sendall(rng.randbytes(rng.randrange(1, 400)))
            assert sent >= 300, f"only {sent} fuzzed messages in {SECONDS:g} s"
            store.check()  # still up
            np.testing.assert_array_equal(c.pull(FEAT, np.arange(10)).shape, (10, 8))
        time.sleep(1.0)
        assert proc.memory_info().rss - rss0 < 64 << 20, "memory grew under fuzzing"
        assert proc.num_fds() - fds0 < 10, "file descriptors leaked under fuzzing"
        with KVClient(ClientConfig([address], job="after", keys=keys)) as c:
            assert c.pull(FEAT, [0]).shape == (1, 8)
        lines = store.log_path.read_text(errors="replace").splitlines()
        assert len(lines) < 200, f"{len(lines)} log lines: not rate-limited"


def _vm_hwm(pid: int) -> int:
    """The peak resident memory of a process (bytes), from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def test_many_frame_messages_leave_the_store_flat(tmp_path):
    """A key holder made the server buffer gigabytes with one many-frame message (VmHWM
    84 MiB -> 2 GiB before its 64-frame check): libzmq keeps a message whole before the
    server sees it, and MAXMSGSIZE bounds one frame only. The connection guard cuts such
    a connection past the request limit; the server keeps serving."""
    from graphrun.rpc.auth import generate_keys, load_keys
    from graphrun.rpc.codec import DEFAULT_LIMITS
    from graphrun.testing.store import make_partition_dir

    _, parts = make_partition_dir(tmp_path / "parts", 1)
    key_file = tmp_path / "job.key"
    generate_keys(key_file)
    keys = load_keys(key_file)
    frame = np.zeros(8 << 20, np.uint8)  # one buffer, sent 320 times zero-copy: 2.5 GiB
    with start_stores(parts, 1, key_file=key_file, shm_dir=tmp_path) as stores:
        store = stores[0]
        with KVClient(ClientConfig([store.address], job="flat", keys=keys)) as c:
            c.pull(FEAT, np.arange(10))
            hwm0 = _vm_hwm(store.pid)
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            secure_client(sock, keys)
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.connect(store.address)
            header = encode(Message(MsgKind.REQUEST, "pull", 1, {"s": c.session.id}, ()))[0]
            sock.send(header, zmq.SNDMORE)
            for _ in range(319):
                sock.send(frame, zmq.SNDMORE, copy=False)
            sock.send(frame, copy=False)
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            assert poller.poll(120_000), "neither cut nor answered"  # cut, or refused whole
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
            ctx.term()
            store.check()  # still up, still serving
            np.testing.assert_array_equal(c.pull(FEAT, np.arange(10)).shape, (10, 8))
            grew = _vm_hwm(store.pid) - hwm0
        limit = DEFAULT_LIMITS.max_request_bytes
        assert grew < 3 * limit, f"the server's peak memory grew by {grew >> 20} MiB"
