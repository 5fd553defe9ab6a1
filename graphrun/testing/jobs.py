"""Small real roles for testing the launcher before (and besides) the real store.

``fake_store(port)`` is a TCP server that accepts connections until killed;
``fake_trainer(code)`` runs a snippet of Python. Both are plain ``python -c``
processes, so the launcher's process handling is tested with real processes.
``kill_when_training(status_file, role)`` SIGKILLs a role of a running job.

For real jobs on a small generated graph (``small_job``): ``local_job`` makes the
launcher of one with its console in a string, ``job_metrics`` reads its metrics, and
``nothing_left`` / ``no_children`` check that it left no process or shared memory.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import yaml

from graphrun.job.hosts import free_ports
from graphrun.machine.launch import MachineLaunch, RoleLaunch, Servers
from graphrun.names import Endpoint, RoleName

if TYPE_CHECKING:
    from graphrun.local.runner import LocalJob

STORE_CODE = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], int(sys.argv[1])))
s.listen()
print("listening on", sys.argv[1], flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""


def fake_store(role: RoleName, machine: str, port: int, host: str = "127.0.0.1") -> RoleLaunch:
    argv = (sys.executable, "-c", STORE_CODE, str(port), host)
    return RoleLaunch.of("store", role, argv, ready=Endpoint(host, port))


def fake_trainer(role: RoleName, machine: str, code: str) -> RoleLaunch:
    return RoleLaunch.of("trainer", role, (sys.executable, "-c", code))


def alone(*endpoints: Endpoint) -> tuple[Servers, ...]:
    """What a machine waits for, each endpoint a server of its own (no backup, no
    replica)."""
    return tuple(Servers(of=str(e), main=(e,)) for e in endpoints)


def two_machines(
    trainer_code: dict[int, str],
    ready_timeout_s: float = 30.0,
    addresses: tuple[str, str] = ("127.0.0.1", "127.0.0.1"),
    ports: list[int] | None = None,
) -> list[MachineLaunch]:
    """m0 and m1, each with one fake store server and one trainer running the given code."""
    ports = ports or free_ports(2)
    stores = [Endpoint(addresses[i], p) for i, p in enumerate(ports)]
    return [
        MachineLaunch(
            machine=f"m{i}",
            roles=(
                fake_store(RoleName.store(i), f"m{i}", ports[i], addresses[i]),
                fake_trainer(RoleName.trainer(i), f"m{i}", trainer_code.get(i, "pass")),
            ),
            wait_for=alone(*stores),
            ready_timeout_s=ready_timeout_s,
        )
        for i in range(2)
    ]


def job_yaml(tmp_dir: Path, name: str = "t", **training: object) -> Path:
    """A 2-machine GraphJob file over a (possibly absent) dataset ``data/`` in ``tmp_dir``."""
    train: dict[str, object] = {"task": "node-classification", "epochs": 1, **training}
    if "entryPoint" in training or "script" in training:
        del train["task"]
    spec = {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "GraphJob",
        "metadata": {"name": name},
        "spec": {
            "graph": {"dataset": "data"},
            "partition": {"parts": 2, "output": "parts"},
            "runtime": {"machines": 2},
            "training": train,
            "runPolicy": {"backoffLimit": 0},
        },
    }
    path = Path(tmp_dir) / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def fake_partition(tmp_dir: Path, parts: int = 2) -> Path:
    """A partition directory whose metadata says ``parts`` empty parts of an empty graph
    (a valid ``partition.json``, no arrays: fake stores)."""
    import numpy as np

    from graphrun.partition.book import PartitionBook

    out = Path(tmp_dir) / "parts"
    out.mkdir(parents=True, exist_ok=True)
    zeros = np.zeros((1, parts + 1), dtype=np.int64)
    book = PartitionBook(parts, ("_N",), (("_N", "_E", "_N"),), zeros[0], zeros[0], zeros, zeros)
    empty = {"num_inner_nodes": 0, "num_local_nodes": 0, "num_inner_edges": 0}
    meta = {
        "format": "graphrun-partition",
        "version": 1,
        **book.to_config(),
        "parts": [{"dir": f"part-{k}", **empty} for k in range(parts)],
    }
    (out / "partition.json").write_text(json.dumps(meta))
    return out


def fake_dataset(tmp_dir: Path) -> Path:
    """A dataset directory ``data/`` with only its ``graph.json`` (for fake roles, which
    never read it; a job refuses to start without its dataset)."""
    out = Path(tmp_dir) / "data"
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph.json").write_text("{}")
    return out


# ---- real jobs on a small generated graph ---------------------------------------------


def small_job(
    tmp_dir: Path, nodes: int = 2000, machines: int = 2, hetero: bool = False,
    run_policy: dict[str, object] | None = None, runtime: dict[str, object] | None = None,
    placement: dict[str, object] | None = None, **training: object,
) -> Path:  # fmt: skip
    """Dataset + partition + GraphJob file in ``tmp_dir`` (``nodes`` nodes, 4 classes)."""
    from graphrun.graph import save_dataset
    from graphrun.graph.generate import GenParams, academic, community
    from graphrun.partition import partition_graph

    params = GenParams(nodes=nodes, avg_degree=8, feat_dim=16, classes=4, seed=0)
    graph = academic(params) if hetero else community(params)
    save_dataset(graph, Path(tmp_dir) / "data")
    partition_graph(graph, Path(tmp_dir) / "parts", machines, "random" if hetero else "metis")
    train: dict[str, object] = {
        "task": "node-classification", "epochs": 1, "batchSize": 100,
        "fanouts": [5, 5], "hidden": 32, "lr": 0.01, **training,
    }  # fmt: skip
    if "entryPoint" in training or "script" in training:
        del train["task"]
    spec = {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "GraphJob",
        "metadata": {"name": "small"},
        "spec": {
            "graph": {"dataset": "data"},
            "partition": {"parts": machines, "output": "parts"},
            "runtime": {"machines": machines, **(runtime or {})},
            "training": train,
            "runPolicy": run_policy or {},
            "placement": placement or {},
        },
    }  # fmt: skip
    path = Path(tmp_dir) / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def local_job(path: Path, grace_s: float = 3.0, **opts: Any) -> tuple[LocalJob, io.StringIO]:
    """The launcher of the job file ``path`` (``RunOptions(**opts)``), its console a
    string: ``job.run()`` runs it."""
    from graphrun.job.spec import load_job
    from graphrun.local.runner import LocalJob, RunOptions

    sink = io.StringIO()
    job = LocalJob(load_job(path), path, RunOptions(grace_s=grace_s, **opts), sink=sink)
    return job, sink


def job_metrics(path: Path, name: str = "small") -> list[dict[str, Any]]:
    """The records of ``runs/<name>/metrics.jsonl`` beside the job file ``path``."""
    lines = (path.parent / "runs" / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def wait_for(cond: Callable[[], bool], timeout: float = 180.0) -> bool:
    """Whether ``cond()`` came true within ``timeout`` s (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


# descendants alive when the running test began (tests/conftest.py): another test's, so
# not this one's to answer for (a package-scoped store fixture, or another test's leak)
BEFORE_TEST: set[tuple[int, float]] = set()


def no_children(timeout: float = 5.0) -> None:
    """Waits up to ``timeout`` s for this process to have no living descendant that the
    running test started."""
    from graphrun.testing.procs import live_children

    def mine() -> list[Any]:
        out = []
        for p in live_children():
            try:
                if (p.pid, p.create_time()) not in BEFORE_TEST:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def said(procs: list[Any]) -> list[str]:
        out = []
        for p in procs:
            try:
                out.append(f"{p.pid}: {' '.join(p.cmdline())[:300]}")
            except psutil.Error:
                continue
        return out

    deadline = time.monotonic() + timeout
    while mine():
        assert time.monotonic() < deadline, said(mine())
        time.sleep(0.1)


def nothing_left(job: LocalJob) -> None:
    """No descendant process of this one left, and no shared memory segment of the job's
    store servers."""
    no_children()
    store_pids = [pid for role, pid in job.pids.items() if role.kind == "store"]
    assert store_pids
    prefixes = tuple(f"graphrun-{x}-" for x in store_pids)
    assert [p for p in os.listdir("/dev/shm") if p.startswith(prefixes)] == []


def raise_on_rank_1(ctx: Any) -> None:
    """A user entry point: trainer 1 raises, trainer 0 waits (the launcher must stop it).
    Trainer 1 first writes a line to ``unclosed.txt`` beside the metrics and leaves the
    file open: it is flushed when the failure is over, as Python's exit would."""
    import time

    here = Path(ctx.config.metrics_file).parent
    if ctx.rank == 1:
        # trainer 0 in its entry point first: a peer still forming the process group
        # when this one dies may blame its own failure on it (a race of its own)
        deadline = time.monotonic() + 60
        while not (here / "rank0-waiting").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        note = open(here / "unclosed.txt", "w")  # noqa: SIM115
        note.write("written before the error\n")
        raise RuntimeError("boom on purpose")
    (here / "rank0-waiting").touch()
    time.sleep(120)


def wait(ctx: Any) -> None:
    """A user entry point that only waits (to be stopped)."""
    import time

    print(f"trainer {ctx.rank} waiting", flush=True)
    time.sleep(120)


def fail_unless_resumed(ctx: Any) -> dict[str, bool]:
    """A user entry point: trainer 1 fails on the first attempt; restarted, all succeed."""
    if ctx.rank == 1 and not ctx.config.resume:
        raise RuntimeError("first attempt fails on purpose")
    return {"resumed": ctx.config.resume}


def kill_when_training(
    status_file: Path, role: RoleName, timeout: float = 60.0
) -> threading.Thread:
    """A daemon thread that SIGKILLs ``role`` once its machine's worker status file says
    ``training`` (gives up after ``timeout`` s)."""
    from graphrun.record import read_status

    def kill() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = read_status(status_file)
            if st and st.state == "training" and role in st.pids():
                os.kill(st.pids()[role], signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread
