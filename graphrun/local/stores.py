"""Store server processes outside a job: benchmarks, tests, a store for several jobs.

    from graphrun.local.stores import start_store, start_stores

    with start_stores(parts_dir, num_parts=2, keys=key_file) as stores:
        client = KVClient(ClientConfig([s.address for s in stores], keys=load_keys(key_file)))
        ...

* :func:`start_store` runs ``python -m graphrun serve DIR --part K ...`` (the real
  command) in a child process, waits until it is ready (its ``--ready-file``
  appears), and returns a :class:`StoreProcess` with ``address``, ``pid``,
  ``stop()`` (SIGTERM, wait), ``kill()`` (SIGKILL) and ``check()``, which raises
  :class:`StoreFailed` with the child's exit code and the tail of its log if it died.
  If the child dies or is not ready in ``ready_timeout`` s, ``start_store`` raises
  ``StoreFailed`` the same way.
* ``backups=N`` starts N backups with the main (``--backups``) and waits until the main
  announces them.
* :func:`start_stores` starts one per partition and stops them all on exit.
* ``extensions=["graphrun.sampling.server:register"]`` passes ``--extension``;
  ``launcher=["ip", "netns", "exec", "ns1"]`` prefixes the command (it must exec it).

Every child's stdout/stderr goes to a log file (``StoreProcess.log_path``), shown in
failures; without ``log_dir`` it is in a temporary directory of its own, removed once
the server is stopped or killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from graphrun.errors import StoreFailed
from graphrun.local.machines import package_env


@dataclass
class StoreProcess:
    proc: subprocess.Popen[bytes]
    address: str
    part: int
    log_path: Path
    own_dir: Path | None = None  # the temporary directory of its log, removed when it ends

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        """Raise :class:`StoreFailed` (exit code + log tail) if the server died."""
        code = self.proc.poll()
        if code is not None:
            raise StoreFailed(
                f"store server of partition {self.part} exited with code {code}:\n"
                + self.log_tail()
            )

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code (kills after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5)
        self._remove_own_dir()
        return code

    def kill(self) -> None:
        """SIGKILL: the server gets no chance to clean up."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._remove_own_dir()

    def _remove_own_dir(self) -> None:
        if self.own_dir is not None:
            shutil.rmtree(self.own_dir, ignore_errors=True)


def start_store(
    partition_dir: str | Path,
    part: int,
    *,
    key_file: str | Path | None = None,
    address: str = "tcp://127.0.0.1:0",
    backups: int = 0,
    heartbeat_timeout: float = 30.0,
    shm_dir: str | Path | None = None,
    extensions: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 60.0,
    log_dir: str | Path | None = None,
    launcher: Sequence[str] = (),
) -> StoreProcess:
    """Start ``graphrun serve`` for one partition and wait until it serves."""
    tmp = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="graphrun-store-"))
    own_dir = None if log_dir else tmp
    ready = tmp / f"ready-{part}-{time.monotonic_ns()}.json"
    log_path = tmp / f"store-{part}-{time.monotonic_ns()}.log"
    cmd = [*launcher, sys.executable, "-m", "graphrun", "serve", str(partition_dir)]
    cmd += ["--part", str(part)]
    cmd += ["--address", address, "--ready-file", str(ready), "--backups", str(backups)]
    cmd += ["--heartbeat-timeout", str(heartbeat_timeout)]
    cmd += ["--key-file", str(key_file)] if key_file is not None else ["--insecure"]
    if shm_dir is not None:
        cmd += ["--shm-dir", str(shm_dir)]
    for ext in extensions or ():
        cmd += ["--extension", ext]
    cmd += list(extra_args)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **package_env()}
        )
    sp = StoreProcess(proc, "", part, log_path, own_dir)
    if own_dir is not None:  # also when a caller drops a store it never stopped (a crash test)
        weakref.finalize(sp, shutil.rmtree, own_dir, True)
    deadline = time.monotonic() + ready_timeout
    while not ready.exists():
        sp.check()
        if time.monotonic() > deadline:
            sp.kill()
            raise StoreFailed(f"store of partition {part} not ready in {ready_timeout} s")
        time.sleep(0.05)
    sp.address = json.loads(ready.read_text())["address"]
    if backups:
        _wait_backups(sp, backups, key_file, deadline)
    return sp


def _wait_backups(sp: StoreProcess, n: int, key_file: str | Path | None, deadline: float) -> None:
    from graphrun.rpc.auth import load_keys
    from graphrun.rpc.transport import RpcClient

    keys = load_keys(key_file) if key_file else None
    with RpcClient(sp.address, keys=keys, timeout=10) as c:
        while len(c.call("stats").body["backups"]) < n:
            sp.check()
            if time.monotonic() > deadline:
                raise StoreFailed(f"backups of partition {sp.part} not registered in time")
            time.sleep(0.1)


@contextlib.contextmanager
def start_stores(
    partition_dir: str | Path, num_parts: int, **kwargs: object
) -> Iterator[list[StoreProcess]]:
    """One server per partition; all stopped (SIGTERM) on exit, failures re-raised."""
    procs: list[StoreProcess] = []
    try:
        for p in range(num_parts):
            procs.append(start_store(partition_dir, p, **kwargs))  # type: ignore[arg-type]
        yield procs
        for sp in procs:
            sp.check()
    finally:
        for sp in procs:
            sp.stop()
