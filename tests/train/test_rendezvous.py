"""The trainers' CURVE rendezvous: key holders meet, strangers get nothing."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest

from graphrun.errors import RpcTimeout
from graphrun.job.hosts import free_ports
from graphrun.rpc.auth import generate_keys, new_keypair
from graphrun.testing.procs import run_then_exit, torch_processes
from graphrun.train.rendezvous import KeyStore, RendezvousServer


@pytest.fixture
def served():
    keys = new_keypair()
    server = RendezvousServer("tcp://127.0.0.1:*", keys)
    try:
        yield server, keys
    finally:
        server.close()


def test_the_store_operations_torch_uses(served) -> None:
    server, keys = served
    store = KeyStore(server.endpoint, keys, timeout_s=5)
    try:
        store.set("addr/0", b"10.0.0.1:4242")
        assert store.get("addr/0") == b"10.0.0.1:4242"
        assert store.add("count", 1) == 1 and store.add("count", 2) == 3
        assert store.check(["addr/0", "count"]) and not store.check(["addr/1"])
        assert store.compare_set("cas", b"", b"first") == b"first"
        assert store.compare_set("cas", b"other", b"second") == b"first"
        assert store.num_keys() == 3
        assert store.delete_key("cas") and not store.delete_key("cas")
        store.set_timeout(timedelta(seconds=0.3))
        with pytest.raises(RpcTimeout, match="not set within"):
            store.get("never")
    finally:
        store.close()


def test_a_stranger_is_refused_and_changes_nothing(served) -> None:
    server, keys = served
    stranger = KeyStore(server.endpoint, new_keypair(), timeout_s=1.5)  # another job's key
    try:
        with pytest.raises(RpcTimeout, match="answers only the job's key"):
            stranger.set("addr/0", b"6.6.6.6:1")  # would redirect a trainer's gloo links
        with pytest.raises(RpcTimeout):
            stranger.get("addr/0")
    finally:
        stranger.close()
    # one who knows the job's public key (it is no secret) and so passes the server's
    # half of the handshake, with a key pair of its own, fares no better
    own = new_keypair()
    public_only = KeyStore(server.endpoint, type(keys)(own.public, own.secret, keys.public), 1.5)
    try:
        with pytest.raises(RpcTimeout):
            public_only.add("count", 1)
    finally:
        public_only.close()
    # bytes that are not ZeroMQ at all
    host, port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as raw:
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
    member = KeyStore(server.endpoint, keys, timeout_s=5)
    try:
        assert member.num_keys() == 0  # nothing was set, and the server still answers
        member.set("addr/0", b"10.0.0.1:4242")
        assert member.get("addr/0") == b"10.0.0.1:4242"
    finally:
        member.close()


def _trainer(rank: int, port: int, key: str, out: mp.Queue) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    from graphrun.rpc.auth import load_keys
    from graphrun.train.ddp import DDPConfig, process_group

    cfg = DDPConfig(rank, 2, f"127.0.0.1:{port}", backend="gloo", timeout_s=60,
                    keys=load_keys(key))  # fmt: skip
    with process_group(cfg):
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        out.put((rank, float(t)))


@pytest.mark.integration
def test_two_trainers_meet_through_it_and_all_reduce(tmp_path: Path) -> None:
    """Two trainer processes (forked from the fork server: torch imported once)."""
    key = tmp_path / "job.key"
    generate_keys(key)
    (port,) = free_ports(1)
    ctx = torch_processes()
    out: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=run_then_exit, args=(_trainer, r, port, str(key), out)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got == [(0, 3.0), (1, 3.0)]
