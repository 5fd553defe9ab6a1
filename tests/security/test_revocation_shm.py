"""Revocation reaches co-located clients (issue 40, item 8): a job whose key file is
removed stopped reading over the network in 0.05 s, but went on reading features (and
sampling) from the store's shared memory for as long as it liked."""

from __future__ import annotations

import time

import numpy as np
import pytest

from graphrun.errors import AuthError
from graphrun.local.stores import start_store
from graphrun.rpc.auth import generate_keys, load_keys
from graphrun.sampling.distributed import DistOneHopSampler
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.session import REVOCATION_BOUND_S
from graphrun.testing.procs import run_graphrun
from graphrun.testing.store import make_partition_dir
from tests.security.conftest import FEAT


def _job_key(tmp_path, clients, job: str):
    done = run_graphrun("keygen", str(tmp_path / f"{job}.key"), "--store",
                        str(tmp_path / "store.key"), "--clients", str(clients))  # fmt: skip
    assert done.returncode == 0, done.stderr
    return load_keys(tmp_path / f"{job}.key")


def _reads(client: KVClient, sampler: DistOneHopSampler) -> None:
    client.pull(FEAT, [0, 1, 2])
    sampler.sample_one_hop([0, 1, 2], [3], seed=0)


@pytest.fixture(params=["memory", "disk"])
def store(tmp_path, request):
    """One store; with disk features co-located clients read the shared cache and the
    files themselves (store/disk.py), and the same check must stop them."""
    parts = make_partition_dir(tmp_path / "parts", 1)[1]
    generate_keys(tmp_path / "store.key")
    clients, shm = tmp_path / "clients", tmp_path / "shm"
    clients.mkdir()
    shm.mkdir()
    args = ["--clients", str(clients), "--features", request.param, "--disk-cache-mb", "0.001"]
    sp = start_store(parts, 0, key_file=tmp_path / "store.key", shm_dir=shm,
                     extra_args=args, log_dir=tmp_path)  # fmt: skip
    try:
        yield sp, clients
    finally:
        sp.stop()


def test_a_revoked_co_located_client_stops_reading_shared_memory(store, tmp_path):
    sp, clients = store
    keys = {job: _job_key(tmp_path, clients, job) for job in ("job-a", "job-b")}
    a, b = (KVClient(ClientConfig([sp.address], job=j, keys=keys[j], use_shm=None, timeout=10))
            for j in ("job-a", "job-b"))  # fmt: skip
    try:
        samplers = {c.job: DistOneHopSampler(c, c.book) for c in (a, b)}
        assert a.local_parts == [0] and samplers["job-a"].local.keys() == {0}
        _reads(a, samplers["job-a"])
        shm_bytes = a.traffic[0, "pull:shm"]
        assert shm_bytes > 0 and a.traffic[0, "pull"] == 0  # read from shared memory
        (clients / "job-a.key").unlink()
        start = time.monotonic()
        while True:
            try:
                _reads(a, samplers["job-a"])
            except AuthError as exc:
                assert "job key of 'job-a' was revoked" in str(exc)
                break
            took = time.monotonic() - start
            assert took < REVOCATION_BOUND_S, f"a revoked key still read for {took:.2f} s"
            time.sleep(0.01)
        with pytest.raises(AuthError, match="revoked"):  # the sampler alone too
            samplers["job-a"].sample_one_hop([0], [2], seed=1)
        with pytest.raises(AuthError, match="revoked"):
            a.pull(FEAT, [0])
        assert a.traffic[0, "pull"] == 0  # and it never fell back to the network
        # another job's key is untouched: it keeps its shared memory
        _reads(b, samplers["job-b"])
        assert b.traffic[0, "pull:shm"] > 0 and b.traffic[0, "pull"] == 0
        np.testing.assert_array_equal(b.pull(FEAT, [0]), b.pull(FEAT, [0]))
    finally:
        a.close()
        b.close()
    sp.check()
