"""A real small trained job, its graph served by two store servers (a job key of their
own), and a real endpoint process (`graphrun infer serve`, uvicorn) with a bearer token:
shared by the tests of this package."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from graphrun.cli import main
from graphrun.local.stores import StoreProcess, start_store
from graphrun.names import RoleName
from graphrun.testing.jobs import local_job, small_job

TOKEN = "a-test-token-of-32-characters-00"


@dataclass
class Served:
    job_file: Path
    parts: Path
    key: Path  # the job key
    store_key: Path
    clients: Path
    stores: list[StoreProcess]
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def servers(self) -> list[str]:
        return [s.address for s in self.stores]

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def restart_store(self, part: int) -> None:
        """Start partition ``part``'s server again at its old address."""
        old = self.stores[part]
        self.stores[part] = start_store(
            self.parts, part, key_file=self.store_key, address=old.address,
            extra_args=["--clients", str(self.clients)],
        )  # fmt: skip


def serve_endpoint(
    d: Path, args: list[str], prefix: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str, Path]:
    ready, log = d / f"ready-{time.monotonic_ns()}.json", d / f"endpoint-{time.monotonic_ns()}.log"
    cmd = [*prefix, sys.executable, "-m", "graphrun", "infer", "serve", *args, "--port", "0",
           "--ready-file", str(ready)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"endpoint did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())["url"], log


def _train(d: Path, nodes: int) -> Path:
    job_file = small_job(d, nodes=nodes, epochs=1, lr=0.03, precision="fp32")
    job, _ = local_job(job_file)
    assert job.run().exits[RoleName.trainer(0)] == 0
    return job_file


def _session_dir(d: Path) -> Path | None:
    """The directory of this test session that every xdist worker's temporary
    directories are in (``<session>/popen-gwN/...``); None outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return next((p.parent for p in d.parents if p.name == f"popen-{worker}"), None)


def _not_files(where: str, names: list[str]) -> list[str]:
    return [n for n in names if not (os.path.isfile(os.path.join(where, n)) or
                                     os.path.isdir(os.path.join(where, n)))]  # fmt: skip


def trained(d: Path, nodes: int) -> Path:
    """A small job of ``nodes`` nodes trained for one epoch in ``d``: its job file. Under
    xdist the job is trained once a session, by the first worker that asks (the others
    wait on a lock), and copied: a job's run (stores, trainers) took a minute of a loaded
    box on every worker that ran a test of this package or the endpoint's bounds."""
    session = _session_dir(d)
    if session is None:
        return _train(d, nodes)
    shared = session / f"trained-{nodes}"
    with open(session / f"trained-{nodes}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "done").exists():
            shutil.rmtree(shared, ignore_errors=True)
            (shared / "job").mkdir(parents=True)
            _train(shared / "job", nodes)
            (shared / "done").touch()
    shutil.copytree(shared / "job", d, symlinks=True, ignore=_not_files, dirs_exist_ok=True)
    return d / "job.yaml"


def start_served(d: Path, nodes: int = 1000) -> Served:
    """Train a small job in ``d`` (:func:`trained`), serve its graph on two store servers
    with a job key of its own, and start an endpoint on it with :data:`TOKEN`
    (:func:`stop_served` ends it)."""
    job_file = trained(d, nodes)
    assert main(["keygen", str(d / "store.key")]) == 0
    clients = d / "clients"
    assert main(["keygen", str(d / "small.key"), "--store", str(d / "store.key"),
                 "--clients", str(clients)]) == 0  # fmt: skip
    stores: list[StoreProcess] = []
    try:
        for p in range(2):
            stores.append(start_store(d / "parts", p, key_file=d / "store.key",
                                      extra_args=["--clients", str(clients)]))  # fmt: skip
        (d / "token").write_text(TOKEN + "\n")
        args = [str(job_file), "--key-file", str(d / "small.key"), "--token-file", str(d / "token"),
                "--probe-s", "0.2"]  # fmt: skip
        for s in stores:
            args += ["--store", s.address]
        proc, url, log = serve_endpoint(d, args)
    except BaseException:
        for s in stores:
            s.stop()
        raise
    return Served(job_file, d / "parts", d / "small.key", d / "store.key", clients, stores,
                  url, proc, log)  # fmt: skip


def stop_served(served: Served) -> None:
    served.proc.terminate()
    served.proc.wait(30)
    for s in served.stores:
        s.stop()


@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = start_served(tmp_path_factory.mktemp("serving"))
    try:
        yield s
    finally:
        stop_served(s)
