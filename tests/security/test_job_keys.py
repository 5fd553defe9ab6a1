"""What a job key of a shared store may not do (issue 26): write the graph, keep working
after its file is removed, take over another key's session, see the whole store."""

from __future__ import annotations

import time

import numpy as np
import pytest

from graphrun.errors import AuthError, StoreError
from graphrun.rpc.transport import RpcClient
from graphrun.store.shm import host_identity
from tests.security.conftest import FEAT


def _push(c, name, rows, values, **body):
    return c.session.call(0, "push", {"name": name, **body}, tensors=(np.asarray(rows), values))


def test_a_job_key_cannot_write_the_graph(shared_store):
    """`push` with allow_graph from a job key rewrote rows of node/_N/feat that every
    other job reads; so did an optimizer push naming a graph tensor as its state."""
    with shared_store.client(shared_store.job_key("jobA"), "jobA") as a:
        before = a.pull(FEAT, [0, 1]).copy()
        ones = np.ones((2, 8), np.float32)
        with pytest.raises(AuthError, match="read-only to a job key"):
            _push(a, FEAT, np.array([0, 1]), ones, allow_graph=True)
        with pytest.raises(AuthError, match="read-only to a job key"):
            _push(a, FEAT, np.array([0, 1]), ones, reducer="add", allow_graph=True)
        a.init_tensor("emb", "node:_N", (8,))
        with pytest.raises(AuthError, match="read-only to a job key"):
            _push(a, "emb", np.array([0, 1]), ones, reducer="sparse_adagrad",
                  states=[FEAT], allow_graph=True)  # fmt: skip
        with pytest.raises(StoreError, match="cannot be deleted"):
            a.session.call(0, "delete", {"name": FEAT})
        np.testing.assert_array_equal(a.pull(FEAT, [0, 1]), before)
    with shared_store.client(shared_store.admin, "ops") as admin:  # the admin key may
        _push(admin, FEAT, np.array([0]), np.zeros((1, 8), np.float32), allow_graph=True)
        assert not admin.pull(FEAT, [0]).any()
        with pytest.raises(StoreError, match="read-only unless allow_graph"):
            _push(admin, FEAT, np.array([0]), np.zeros((1, 8), np.float32))


def test_a_removed_job_key_is_refused_on_open_and_new_connections(shared_store):
    """The clients directory was read again only when an unknown key knocked: a removed
    key kept its connections, its sessions and could open new ones."""
    key = shared_store.job_key("jobA")
    with shared_store.client(shared_store.admin, "ops") as admin:
        a = shared_store.client(key, "jobA", heartbeat_interval=0)
        try:
            a.init_tensor("emb", "node:_N", (2,))
            assert admin.stats(0)["jobs"] == {"jobA": 1, "ops": 1}
            (shared_store.clients / "jobA.key").unlink()
            deadline = time.monotonic() + 10
            while True:  # refused within about a second (the server's tick)
                try:
                    a.pull(FEAT, [0])
                except AuthError as exc:
                    assert "job key of 'jobA' was revoked" in str(exc)
                    break
                assert time.monotonic() < deadline, "a removed key was still served"
                time.sleep(0.05)
            deadline = time.monotonic() + 10
            while "jobA" in admin.stats(0)["jobs"]:  # its sessions end, its tensors go
                assert time.monotonic() < deadline, "the revoked key's session stayed"
                time.sleep(0.05)
            assert not [t for t in admin.stats(0)["tensors"] if t.startswith("jobA/")]
            with pytest.raises(AuthError, match="revoked"):
                a.session.call(0, "heartbeat", a.session.base())
        finally:
            a.close()
        with pytest.raises(AuthError):  # a new connection: refused in the handshake
            shared_store.client(key, "jobA", timeout=3)


def test_a_session_id_belongs_to_the_key_that_made_it(shared_store):
    """`join` with another job's session id took that session over."""
    with shared_store.client(shared_store.job_key("jobA"), "jobA") as a:
        b_key = shared_store.job_key("jobB")
        with RpcClient(shared_store.address, keys=b_key, timeout=10) as b:
            for op in ("join", "heartbeat", "leave", "list"):
                with pytest.raises(AuthError, match="belongs to another key"):
                    b.call(op, {"s": a.session.id, "job": "jobB"})
            assert b.call("join", {"s": "b-own", "job": "jobB"}).body["part"] == 0
        with (
            RpcClient(shared_store.address, keys=shared_store.admin, timeout=10) as adm,
            pytest.raises(AuthError, match="belongs to another key"),
        ):
            adm.call("join", {"s": a.session.id, "job": "ops"})
        assert a.pull(FEAT, [0]).shape == (1, 8)  # still a's
        assert a.session.call(0, "heartbeat", a.session.base()).body["known"]


def test_a_job_key_sees_its_job_only(shared_store):
    """A job key's `stats` showed store-wide request counts, and `join` the host name and
    boot id; co-location still works for it (a hash proves the same boot)."""
    with shared_store.client(shared_store.job_key("jobA"), "jobA", use_shm=None) as a:
        a.pull(FEAT, [0])
        assert a.local_parts == [0]  # the shared memory is still found by a job key
        stats = a.stats(0)
        assert stats["served"] == {} and stats["reply_bytes"] == {}
        assert set(stats["jobs"]) == {"jobA"}
        host = a.session.parts[0].info.host
        assert set(host) == {"digest"}
        assert host_identity(shared_store.shm)["boot_id"] not in str(host)
    with shared_store.client(shared_store.admin, "ops") as admin:
        assert admin.stats(0)["served"]["join"] >= 2
        assert admin.session.parts[0].info.host == host_identity(shared_store.shm)


def test_stop_servers_with_a_job_key_raises(shared_store):
    """`KVClient.session.stop_servers()` with a job key returned silently although the servers
    refused (only the admin key may stop a store)."""
    with shared_store.client(shared_store.job_key("jobA"), "jobA") as a:
        with pytest.raises(AuthError, match="needs the store's admin key"):
            a.session.stop_servers()
        assert a.pull(FEAT, [0]).shape == (1, 8)  # still serving, still joined


def test_serve_help_gives_the_job_key_recipe(capsys):
    """`serve --help`'s per-job key recipe omitted `--store STORE.key`."""
    from graphrun.cli import main

    assert main(["serve", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "graphrun keygen JOB.key --store STORE.key --clients clients/" in text


def test_a_job_key_cannot_register_a_replica_or_forward_writes(shared_store):
    """A job key that registered a replica would receive every job's writes; one that
    sent `replicate` would write as the primary."""
    with shared_store.client(shared_store.job_key("jobA"), "jobA") as a:
        with pytest.raises(AuthError):
            a.session.call(0, "register_replica", {"address": "tcp://127.0.0.1:9"})
        body = {"op": "push", "job": "jobA", "admin": True, "body": {"name": FEAT}}
        with pytest.raises(AuthError):
            a.session.call(0, "replicate", body)
        assert a.stats(0)["replicas"] == []
