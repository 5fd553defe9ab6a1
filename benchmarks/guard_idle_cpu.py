"""An idle store server's CPU with its connection guard (stop 59: the guard's check
every 50 ms against every 20 ms, ``graphrun.rpc.guard.CHECK_S``).

    NC=8 python benchmarks/guard_idle_cpu.py     # NC clients connected, then 20 s idle

One ``graphrun serve``-like store (the attack test's, ``tests/security/test_server_bounds``)
on a 200-node partition, ``NC`` clients each making one ``stats`` call, then nothing for
``SECONDS``: the server's CPU over that time, from ``/proc/PID/task/*/schedstat``
(nanoseconds, all threads). Prints JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/; graphrun: PYTHONPATH first

from graphrun.rpc.auth import generate_keys
from graphrun.rpc.guard import CHECK_S
from graphrun.rpc.transport import RpcClient
from graphrun.testing.store import make_partition_dir
from tests.security.test_server_bounds import _STORE, REQUEST_BYTES

CLIENTS = int(os.environ.get("NC", "8"))
SECONDS = float(os.environ.get("SECONDS", "20"))


def cpu_s(pid: int) -> float:
    tasks = Path(f"/proc/{pid}/task")
    return (
        sum(int((tasks / t / "schedstat").read_text().split()[0]) for t in os.listdir(tasks)) / 1e9
    )


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    _, parts = make_partition_dir(tmp / "parts", 1, num_nodes=200, num_edges=800)
    keys = generate_keys(tmp / "store.key")
    (tmp / "shm").mkdir()
    code = _STORE.format(limit=REQUEST_BYTES)
    proc = subprocess.Popen([sys.executable, "-c", code, str(parts), str(tmp / "store.key"),
                             str(tmp / "shm")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().split()[-1]
        clients = [RpcClient(address, keys=keys, timeout=10) for _ in range(CLIENTS)]
        for c in clients:
            c.call("stats")
        time.sleep(1)
        a = cpu_s(proc.pid)
        time.sleep(SECONDS)
        b = cpu_s(proc.pid)
        print(json.dumps({"check_s": CHECK_S, "clients": CLIENTS, "seconds": SECONDS,
                          "idle_cpu_percent": round(100 * (b - a) / SECONDS, 2),
                          "load_avg": os.getloadavg()[0]}))  # fmt: skip
        for c in clients:
            c.close()
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
