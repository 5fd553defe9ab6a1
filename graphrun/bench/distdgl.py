"""DistDGL in the same run as graphrun: ``graphrun bench train --peer distdgl``.

DistDGL 2.1 needs its own Python (torch 2.2, numpy < 2), given as ``--peer-python``;
it is never part of graphrun's install or CI. Recipe (a CUDA build of torch 2.2.1,
about 2.5 GB, that runs on CPU)::

    python3 -m venv /opt/distdgl
    /opt/distdgl/bin/pip install torch==2.2.1 "numpy<2" "pandas<2.3" scipy dgl==2.1.0 \\
        pydantic pyyaml psutil requests tqdm "setuptools<70"
    /opt/distdgl/bin/pip install --no-deps torchdata==0.7.1

What runs (:mod:`graphrun.bench.peers.distdgl` under the peer's Python): DGL's
``partition_graph`` (METIS, 2 parts, training nodes and edges balanced) of the same
dataset, then two network-namespace hosts — the same topology as graphrun's
``--hosts netns`` run, with the same link shaping — each with one DistDGL server and
one trainer, in a mount namespace of its own with a private ``/dev/shm`` (DistDGL's
shared-memory names collide when two of its servers share one). Same model size,
fanouts, batch size, learning rate, dropout and epochs as graphrun's run; one torch
thread per trainer, as graphrun's trainers get on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from graphrun.errors import ArgumentError

PEER = Path(__file__).resolve().parent / "peers" / "distdgl.py"
MASTER_PORT = 29611
SERVER_PORT = 30050


def check_peer_python(python: Path | None) -> Path:
    if python is None:
        raise ArgumentError("--peer-python: the DistDGL peer needs a Python with dgl 2.1")
    if not Path(python).is_file() or not os.access(python, os.X_OK):
        raise ArgumentError(f"--peer-python: {python} is not an executable file")
    out = subprocess.run([str(python), "-c", "import dgl"], capture_output=True, timeout=120)
    if out.returncode != 0:
        raise ArgumentError(f"--peer-python: {python} cannot import dgl")
    return Path(python)


class TreeRss(threading.Thread):
    """Peak proportional set size of each host's process tree."""

    def __init__(self, procs: dict[str, subprocess.Popen[bytes]], interval: float = 0.5):
        super().__init__(daemon=True)
        self.procs, self.interval = procs, interval
        self.peak: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.stop.wait(self.interval):
            for m, p in self.procs.items():
                total = 0.0
                try:
                    root = psutil.Process(p.pid)
                    for q in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            total += q.memory_full_info().pss / 2**20
                except psutil.Error:
                    continue
                self.peak[m] = max(self.peak.get(m, 0.0), total)


def run_distdgl(args: Any, workdir: Path) -> dict[str, Any]:
    """Partition with DGL and train with DistDGL on two netns hosts; JSON-ready fields."""
    from graphrun.local.netns import NetnsNetwork

    python = check_peer_python(args.peer_python)
    parts = workdir / "distdgl-parts"
    part_info: dict[str, Any] = {}
    if not (parts / "graph.json").is_file():
        out = subprocess.run(
            [str(python), str(PEER), "partition", str(args.dataset.resolve()), str(parts),
             "--parts", "2"],
            capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        if out.returncode != 0:
            raise ArgumentError(f"DistDGL partition_graph failed: {out.stderr.strip()[-500:]}")
        part_info = json.loads(out.stdout.strip().splitlines()[-1])
    machines = ["m0", "m1"]
    with NetnsNetwork(machines, args.bandwidth_mbit, own_hostnames=False) as net:
        ip_config = workdir / "distdgl-ip_config.txt"
        ip_config.write_text("".join(f"{net.address(m)} {SERVER_PORT}\n" for m in machines))
        train = [
            "--ip-config", str(ip_config), "--part-config", str(parts / "graph.json"),
            "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
            "--fanouts", ",".join(map(str, args.fanouts)), "--hidden", str(args.hidden),
        ]  # fmt: skip
        procs: dict[str, subprocess.Popen[bytes]] = {}
        logs = {m: (workdir / f"distdgl-{m}.log").open("wb") for m in machines}
        t0 = time.time()
        for i, m in enumerate(machines):
            host = [
                str(python), str(PEER), "host", "--machine", str(i), "--world", "2",
                "--ip-config", str(ip_config), "--part-config", str(parts / "graph.json"),
                "--master-addr", net.address("m0"), "--master-port", str(MASTER_PORT),
                "--", *train,
            ]  # fmt: skip
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
            procs[m] = subprocess.Popen(
                [*private_shm(net.hosts[m].namespace), *host], stdout=logs[m],
                stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        rss = TreeRss(procs)
        rss.start()
        try:
            codes = {m: p.wait(timeout=args.peer_timeout) for m, p in procs.items()}
        finally:
            rss.stop.set()
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in logs.values():
                f.close()
    wall = time.time() - t0
    text = (workdir / "distdgl-m0.log").read_text(errors="replace")
    if any(codes.values()):
        raise ArgumentError(f"DistDGL run failed {codes}; see {workdir}/distdgl-m*.log")
    rec = next(json.loads(x) for x in reversed(text.splitlines()) if '"peer": "distdgl"' in x)
    return {
        "distdgl_epoch_s": round(statistics.median(rec["epoch_s_all"]), 4),
        "distdgl_epoch_s_all": rec["epoch_s_all"],
        "distdgl_test_acc": rec["test_acc"],
        "distdgl_eval_s": rec["eval_s"],
        "distdgl_first_step_s": rec["first_step_s"],
        "distdgl_wall_s": round(wall, 1),
        "distdgl_peak_rss_mb": {m: round(v, 1) for m, v in sorted(rss.peak.items())},
        **{f"distdgl_{k}": v for k, v in part_info.items()},
    }


def private_shm(namespace: str) -> list[str]:
    """Run argv in ``namespace`` with a mount namespace and a /dev/shm of its own."""
    shm = 'mount -t tmpfs -o size=50% tmpfs /dev/shm && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", shm, "sh"]
    return ["ip", "netns", "exec", namespace, *unshare]
