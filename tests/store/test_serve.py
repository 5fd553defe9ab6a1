"""Real ``graphrun serve`` processes: backups, long-running serving, failures."""

import gc
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from graphrun.errors import ArgumentError, RpcError, StoreError, StoreFailed
from graphrun.local.stores import start_store, start_stores
from graphrun.rpc.transport import RpcClient
from graphrun.store.client import ClientConfig, KVClient
from graphrun.testing.procs import child_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # store processes each
FEAT = "node/_N/feat"


def client(stores, keys, **kw):
    kw.setdefault("timeout", 10)
    return KVClient(ClientConfig([s.address for s in stores], keys=keys, **kw))


def segments_of(shm_dir, pid):
    return [n for n in os.listdir(shm_dir) if n.startswith(f"graphrun-{pid}-")]


def wait_until(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_backups_serve_the_same_memory(homo, key_file, keys, tmp_path, rng):
    _, parts = homo
    with (
        start_stores(parts, 2, key_file=key_file, backups=1, shm_dir=tmp_path) as stores,
        client(stores, keys, use_shm=False) as c,
    ):
        assert len(c.servers_of(0)) == 2
        ref = None
        ids = rng.integers(0, 600, 300)
        for _ in range(6):
            got = c.pull(FEAT, ids)
            ref = got if ref is None else ref
            assert got.tobytes() == ref.tobytes()
        # a tensor made after the backup started is served by it too
        c.init_tensor("late", "node:_N", (1,))
        c.push("late", [0, 1], np.array([[3.0], [4.0]], np.float32))
        for _ in range(4):
            np.testing.assert_array_equal(c.pull("late", [0, 1]).ravel(), [3, 4])
        assert c.stats(0, 0)["served"].get("pull", 0) > 0
        assert c.stats(0, 1)["served"].get("pull", 0) > 0
        backup = c.servers_of(0)[1]
        with pytest.raises(ArgumentError, match="is backup 1 of partition 0"):
            KVClient(ClientConfig([backup, stores[1].address], keys=keys, timeout=5))


def test_backups_of_a_disk_store_serve_the_files_with_a_cache_each(homo, key_file, keys, tmp_path):
    """``graphrun serve --features disk --backups 1``: the backup is started with the same
    flags and answers pulls of the disk features from the files, its own cache counting
    (a client that pulls: a co-located one reads the files itself, store/disk.py)."""
    _, parts = homo
    disk = ("--features", "disk", "--disk-cache-mb", "0.01")
    with (
        start_stores(parts, 2, key_file=key_file, backups=1, shm_dir=tmp_path,
                     extra_args=disk) as stores,
        client(stores, keys, use_shm=False) as c,
    ):  # fmt: skip
        assert len(c.servers_of(0)) == 2 and c.meta(FEAT).disk
        ref = c.pull(FEAT, np.arange(300))
        for _ in range(6):  # spread over the main and its backup
            assert c.pull(FEAT, np.arange(300)).tobytes() == ref.tobytes()
        for index in (0, 1):
            counts = c.stats(0, index)["disk"]
            assert counts["hits"] > 0 and counts["misses"] > 0
            assert 0 < counts["cache_bytes"] <= 0.01 * 2**20


def test_attach_names_a_tensor_never_a_file(homo, key_file, keys, tmp_path):
    """A key holder's `attach` once mapped any path (absolute or ../..) writable."""
    from graphrun.errors import StoreError
    from graphrun.store.shm import attach

    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"\x01" * 4096)
    _, parts = homo
    with (
        start_stores(parts, 2, key_file=key_file, backups=1, shm_dir=tmp_path) as stores,
        client(stores, keys, use_shm=False) as c,
    ):
        backup = c.session.parts[0].conns[1]
        info = {"name": "x", "job": c.job, "policy": "node:_N", "dtype": "uint8",
                "row_shape": [], "num_rows": 4096, "part_rows": 4096,
                "segment": str(victim), "persistent": False}  # fmt: skip
        for body in ({"name": str(victim)}, {"name": "../victim.bin"}, {"info": info}):
            with pytest.raises((RpcError, StoreError, ArgumentError)):
                backup.call("attach", {"s": c.session.id, "job": c.job, **body})
        with pytest.raises(StoreError, match="does not exist"):
            c.pull(str(victim), [0])
        stores[0].check()
    assert victim.read_bytes() == b"\x01" * 4096
    for bad in (str(victim), "../victim.bin", "graphrun-1-2-ab.0/../../x"):
        with pytest.raises(StoreError, match="not a graphrun segment name"):
            attach(tmp_path, bad, "uint8", (4096,), True)


def _client_script(addresses, key_file, job, heartbeat, action):
    return f"""
import sys, time, numpy as np
from graphrun.rpc.auth import load_keys
from graphrun.store.client import ClientConfig, KVClient
c = KVClient(ClientConfig({addresses!r}, job={job!r}, keys=load_keys({str(key_file)!r}),
                          heartbeat_interval={heartbeat}, timeout=10))
c.init_tensor("scratch", "node:_N", (2,), exist_ok=True)
assert c.pull("node/_N/feat", np.arange(10)).shape == (10, 8)
print("ready", flush=True)
{action}
"""


def _run_client(addresses, key_file, job, heartbeat=0.2, action="c.close()"):
    code = _client_script(addresses, key_file, job, heartbeat, action)
    env = child_env()
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def test_clients_join_and_leave_a_long_running_store(homo, key_file, keys, tmp_path):
    _, parts = homo
    with start_stores(parts, 2, key_file=key_file, shm_dir=tmp_path) as stores:
        addresses = [s.address for s in stores]
        with client(stores, keys, job="observer") as obs:
            for wave in range(2):  # clients come and go; no client count is fixed
                procs = [_run_client(addresses, key_file, f"job{wave}") for _ in range(3)]
                for p in procs:
                    out, err = p.communicate(timeout=60)
                    assert p.returncode == 0, err
                    assert "ready" in out
                st = obs.stats(0)
                assert st["jobs"] == {"observer": 1}
                assert not any(t.startswith(f"job{wave}/") for t in st["tensors"])


def test_two_jobs_share_one_served_graph(homo, key_file, keys, tmp_path):
    _, parts = homo
    with (
        start_stores(parts, 2, key_file=key_file, shm_dir=tmp_path) as stores,
        client(stores, keys, job="a") as a,
        client(stores, keys, job="b") as b,
    ):
        a.init_tensor("w", "node:_N", (1,), init="uniform")
        b.init_tensor("w", "node:_N", (1,))
        assert not np.array_equal(a.pull("w", np.arange(600)), b.pull("w", np.arange(600)))
        assert a.pull(FEAT, [7]).tobytes() == b.pull(FEAT, [7]).tobytes()
        assert a.stats(1)["jobs"] == {"a": 1, "b": 1}


def test_killed_client_is_dropped_and_its_tensors_freed(homo, key_file, keys, tmp_path):
    _, parts = homo
    with start_stores(
        parts, 2, key_file=key_file, shm_dir=tmp_path, heartbeat_timeout=1.5
    ) as stores:
        addresses = [s.address for s in stores]
        victim = _run_client(addresses, key_file, "victim", action="time.sleep(600)")
        assert victim.stdout.readline().strip() == "ready"
        with client(stores, keys, job="watcher") as w:
            assert "victim/scratch" in w.stats(0)["tensors"]
            assert w.stats(0)["jobs"]["victim"] == 1
            victim.kill()
            victim.wait()
            for part in (0, 1):
                wait_until(lambda p=part: "victim" not in w.stats(p)["jobs"], what="drop")
                wait_until(
                    lambda p=part: "victim/scratch" not in w.stats(p)["tensors"], what="free"
                )
            assert w.pull(FEAT, [0]).shape == (1, 8)  # the watcher, heartbeating, stays


def test_killed_server_gives_a_clear_client_error(homo, key_file, keys, tmp_path):
    _, parts = homo
    stores = [start_store(parts, p, key_file=key_file, shm_dir=tmp_path) for p in (0, 1)]
    try:
        with client(stores, keys, timeout=3, use_shm=False) as c:
            assert c.pull(FEAT, np.arange(600)).shape == (600, 8)
            stores[1].kill()
            with pytest.raises(RpcError, match=r"pull to tcp://127\.0\.0\.1:\d+"):
                c.pull(FEAT, np.arange(600))
            assert c.pull(FEAT, [0]).shape == (1, 8)  # partition 0 still answers
    finally:
        for s in stores:
            s.stop()


def test_sigterm_and_stop_command_clean_up_shared_memory(homo, key_file, keys, tmp_path):
    _, parts = homo
    s0 = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path, backups=1)
    s1 = start_store(parts, 1, key_file=key_file, shm_dir=tmp_path)
    assert segments_of(tmp_path, s0.pid) and segments_of(tmp_path, s1.pid)
    assert s0.stop() == 0  # SIGTERM: main and its backup
    assert segments_of(tmp_path, s0.pid) == []
    with RpcClient(s1.address, keys=keys, timeout=5) as rc:
        rc.call("join", {"s": "admin", "job": "ops"})
        rc.call("stop", {"s": "admin"})
    assert s1.proc.wait(20) == 0
    assert segments_of(tmp_path, s1.pid) == []


def test_stale_segments_of_a_killed_store_are_cleaned_at_start(homo, key_file, tmp_path):
    _, parts = homo
    dead = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path)
    dead.kill()  # SIGKILL: no cleanup
    assert segments_of(tmp_path, dead.pid)
    fresh = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path)
    try:
        assert segments_of(tmp_path, dead.pid) == []
        assert segments_of(tmp_path, fresh.pid)
    finally:
        fresh.stop()


def test_store_refuses_a_bad_partition_dir(tmp_path):
    with pytest.raises(StoreFailed, match="exited with code 2"):
        start_store(tmp_path / "missing", 0)


def test_a_profile_in_a_missing_directory_is_one_line(homo, key_file, tmp_path):
    from graphrun.testing.procs import run_graphrun

    _, parts = homo
    bad = tmp_path / "no" / "store-0.jsonl"
    proc = run_graphrun(
        "serve", str(parts), "--part", "0", "--key-file", str(key_file), "--profile", str(bad)
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"--profile: {bad}: {bad.parent} is not a directory" in lines[0]


def test_dead_backup_fails_over_to_the_main(homo, key_file, keys, tmp_path):
    import psutil

    _, parts = homo
    with start_stores(parts, 2, key_file=key_file, backups=1, shm_dir=tmp_path) as stores:
        backup_pid = next(
            ch.pid
            for ch in psutil.Process(stores[0].pid).children()
            if "--backup-of" in ch.cmdline()
        )
        with client(stores, keys, use_shm=False, timeout=3) as c:
            assert len(c.servers_of(0)) == 2
            psutil.Process(backup_pid).kill()
            for _ in range(4):  # some of these go to the dead backup first
                assert c.pull(FEAT, np.arange(10)).shape == (10, 8)
            assert c.servers_of(0) == [stores[0].address]


def test_a_killed_backup_is_unregistered_restarted_and_never_blocks_a_join(
    homo, key_file, keys, tmp_path
):
    """After kill -9 of a backup every new client failed to join (RpcTimeout join, 10 s)."""
    import psutil

    from graphrun.store.state import ServerState

    def backups_of(pid):
        return [ch for ch in psutil.Process(pid).children() if "--backup-of" in ch.cmdline()]

    _, parts = homo
    with start_stores(parts, 2, key_file=key_file, backups=1, shm_dir=tmp_path) as stores:
        (first,) = backups_of(stores[0].pid)
        first.kill()
        first.wait(5)
        t0 = time.monotonic()
        with client(stores, keys, use_shm=False, timeout=10) as c:  # joins at once
            assert time.monotonic() - t0 < 5
            assert c.pull(FEAT, np.arange(10)).shape == (10, 8)
        # unregistered, then restarted by the main (--backup-restarts, default 3)
        wait_until(lambda: "died" in stores[0].log_tail(), what="the death logged")
        wait_until(lambda: [b.pid for b in backups_of(stores[0].pid)] not in ([], [first.pid]),
                   what="a new backup")  # fmt: skip
        with client(stores, keys, use_shm=False) as c:
            wait_until(lambda: len(c.stats(0)["backups"]) == 1, what="re-registered")
            (again,) = c.stats(0)["backups"]
        with client(stores, keys, use_shm=False) as c:
            assert c.servers_of(0) == [stores[0].address, again]
            assert c.pull(FEAT, np.arange(10)).shape == (10, 8)
        stores[0].check()
    # the rule itself, on a state: a registration whose process is gone is dropped
    state = ServerState(0, 0, None, {}, tmp_path, {}, 30.0)  # type: ignore[arg-type]
    state.register_backup("tcp://127.0.0.1:1", first.pid, 0)
    assert state.drop_dead_backups() == ["tcp://127.0.0.1:1"] and state.backups == []


def test_bad_input_leaves_one_log_line_each(homo, key_file, keys, tmp_path):
    import zmq

    from graphrun.rpc.auth import new_keypair, secure_client

    _, parts = homo
    store = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path)
    try:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.linger = 0
        secure_client(s, keys)
        s.connect(store.address)
        s.send_multipart([b"\x00garbage"])
        assert s.poll(5000)
        s.close(0)
        ctx.term()
        with pytest.raises(RpcError):
            KVClient(ClientConfig([store.address], keys=new_keypair(), timeout=2))
        wait_until(lambda: "refused a connection" in store.log_tail(), what="auth log line")
        log = store.log_tail()
        assert "bad message from peer" in log and "not valid msgpack" in log
        store.check()  # still running
    finally:
        assert store.stop() == 0


def test_a_client_that_exits_without_close_leaves_at_once(homo, key_file, keys, tmp_path):
    # it used to hold its session (and its job's tensors) until the heartbeat timeout (30 s)
    _, parts = homo
    with start_stores(parts, 2, key_file=key_file, shm_dir=tmp_path) as stores:
        addresses = [s.address for s in stores]
        with client(stores, keys, job="watcher") as w:
            quitter = _run_client(addresses, key_file, "quitter", action="pass")  # no close()
            out, err = quitter.communicate(timeout=60)
            assert quitter.returncode == 0 and "ready" in out, err
            for part in (0, 1):  # well before the 30 s heartbeat timeout
                wait_until(lambda p=part: "quitter" not in w.stats(p)["jobs"], 5.0, "leave")


def test_too_little_shared_memory_is_one_line_and_leaves_nothing(homo, key_file, keys, tmp_path):
    """A 64 KiB shm dir: the store died of SIGBUS (exit 135) with no message and left
    segments behind; an `init` bigger than what is free killed it on the next pull."""
    from graphrun.errors import StoreError
    from graphrun.testing.procs import run_graphrun
    from graphrun.testing.tmpfs import small_tmpfs

    _, parts = homo
    with small_tmpfs(tmp_path / "small", "64k") as shm:
        proc = run_graphrun(
            "serve", str(parts), "--part", "0", "--key-file", str(key_file), "--shm-dir", str(shm)
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert f"shared memory {shm}:" in lines[0] and "bytes needed" in lines[0]
        assert list(shm.iterdir()) == []
    with (
        small_tmpfs(tmp_path / "medium", "2m") as shm,
        start_stores(parts, 2, key_file=key_file, shm_dir=shm) as stores,
        client(stores, keys, use_shm=False) as c,
    ):
        before = sorted(os.listdir(shm))
        with pytest.raises(StoreError, match="bytes needed"):
            c.init_tensor("huge", "node:_N", (100_000,))  # ~120 MB on a 2 MiB shm dir
        assert sorted(os.listdir(shm)) == before
        assert c.pull(FEAT, [0, 1]).shape == (2, 8)
        for s in stores:
            s.check()


def test_an_unauthenticated_peer_cannot_grow_the_server(homo, key_file, keys, tmp_path):
    """libzmq checks MAXMSGSIZE before the CURVE handshake: at 16 GiB a peer without the
    key could declare an 8 GiB frame and stream it into the server's memory."""
    import socket
    import struct

    import psutil

    _, parts = homo
    store = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path)
    try:
        rss = psutil.Process(store.pid).memory_info().rss
        host, port = store.address.removeprefix("tcp://").rsplit(":", 1)
        sent = 0
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00"
            greeting += b"CURVE".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
            sock.sendall(greeting)
            sock.sendall(b"\x06" + struct.pack(">Q", 8 << 30))  # a long command frame
            chunk = b"\x00" * (1 << 20)
            try:
                while sent < 300 << 20:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # dropped at once: the frame is over the limit
        assert sent < 64 << 20, f"the server read {sent >> 20} MiB before dropping the peer"
        assert psutil.Process(store.pid).memory_info().rss - rss < 64 << 20
        with RpcClient(store.address, keys=keys, timeout=5) as rc:  # and it serves on
            assert rc.call("stats").body["part"] == 0
    finally:
        store.stop()


def test_pushes_and_pulls_bigger_than_a_frame_are_split(homo, key_file, keys, tmp_path, rng):
    """Servers refuse frames over 64 MiB; clients cut bigger requests between rows."""
    from graphrun.store.client import REQUEST_FRAME_BYTES, _push_pieces

    rows = np.array([5, 1, 5, 3, 1, 9], np.int64)
    vals = np.arange(6, dtype=np.float64)[:, None] * np.ones((1, REQUEST_FRAME_BYTES // 16))
    pieces = _push_pieces(rows, vals)
    assert len(pieces) > 1 and sum(len(r) for r, _ in pieces) == 6
    for r, v in pieces:  # a row's duplicates stay together, in their order
        assert v.nbytes <= REQUEST_FRAME_BYTES * 2
        for row in set(r.tolist()):
            assert len(r[r == row]) == int((rows == row).sum())
    _, parts = homo
    with (
        start_stores(parts, 2, key_file=key_file, shm_dir=tmp_path) as stores,
        client(stores, keys, use_shm=False) as c,
    ):
        c.init_tensor("wide", "node:_N", (40_000,))  # 600 rows x 160 kB: 48 MB a partition
        values = rng.random((600, 40_000), dtype=np.float32)
        c.push("wide", np.arange(600), values)
        np.testing.assert_array_equal(c.pull("wide", np.arange(600)), values)


def test_job_keys_of_a_shared_store_reach_their_own_job_only(homo, key_file, keys, tmp_path):
    """One key served every job of a shared store: any job could read or overwrite another
    job's tensors, stop the store, or register a backup at any address."""
    from graphrun.cli import main
    from graphrun.errors import AuthError
    from graphrun.rpc.auth import load_keys, new_keypair

    def job_key(name):  # `graphrun keygen clients/JOB.key --store STORE_KEY`
        assert main(["keygen", str(clients / f"{name}.key"), "--store", str(key_file)]) == 0
        return load_keys(clients / f"{name}.key")

    _, parts = homo
    clients = tmp_path / "clients"
    clients.mkdir()
    key_a = job_key("jobA")
    shm = tmp_path / "shm"
    shm.mkdir()
    extra = ["--clients", str(clients)]
    with start_stores(parts, 2, key_file=key_file, shm_dir=shm, extra_args=extra) as stores:
        addresses = [s.address for s in stores]
        with KVClient(ClientConfig(addresses, job="jobA", keys=key_a, use_shm=False)) as a:
            a.init_tensor("emb", "node:_N", (2,))
            assert a.pull(FEAT, [0, 1]).shape == (2, 8)  # the graph: readable
            with pytest.raises(AuthError, match="needs the store's admin key"):
                a.session.call(0, "stop", a.session.base())
            with pytest.raises(AuthError, match="needs the store's admin key"):
                a.session.call(0, "register_backup", {"address": "tcp://10.0.0.1:1", "pid": 1})
            assert all("jobB" not in t for t in a.stats(0)["tensors"])
        with pytest.raises(AuthError, match="acts as job 'jobA', not 'jobB'"):
            KVClient(ClientConfig(addresses, job="jobB", keys=key_a, use_shm=False, timeout=5))
        with pytest.raises(RpcError):  # not admitted at all: refused in the handshake
            KVClient(ClientConfig(addresses, job="jobB", keys=new_keypair(), timeout=2))
        key_b = job_key("jobB")  # admitted without a restart
        time.sleep(1.2)
        with (
            KVClient(ClientConfig(addresses, job="jobB", keys=key_b, use_shm=False)) as b,
            pytest.raises(StoreError, match="does not exist"),
        ):
            b.pull("emb", [0])  # jobA's tensor is not jobB's
        with client(stores, keys, use_shm=False) as admin:  # the admin key: everything
            assert "tensors" in admin.session.call(0, "manifest").body
        for s in stores:
            s.check()


def test_a_store_started_without_a_log_dir_removes_its_own(homo, key_file, tmp_path):
    """Each start_store made a /tmp/graphrun-store-* directory for its log and left it:
    a suite run left hundreds."""
    _, parts = homo
    stopped = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path)
    killed = start_store(parts, 1, key_file=key_file, shm_dir=tmp_path)
    dirs = [stopped.log_path.parent, killed.log_path.parent]
    assert all(d.is_dir() for d in dirs)
    stopped.stop()
    killed.kill()
    assert not any(d.exists() for d in dirs)
    kept = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path, log_dir=tmp_path)
    kept.stop()
    assert kept.log_path.exists()  # a directory the caller gave is the caller's


def test_a_store_dropped_without_stop_removes_its_log_dir(homo, key_file, tmp_path):
    """A store that died (or was killed by a fault test) and was never stopped left its
    /tmp/graphrun-store-* directory: 23 were left on this machine by one day of runs."""
    _, parts = homo
    sp = start_store(parts, 0, key_file=key_file, shm_dir=tmp_path)
    d = sp.log_path.parent
    os.kill(sp.pid, signal.SIGKILL)
    sp.proc.wait(10)
    del sp
    gc.collect()
    assert not d.exists()
