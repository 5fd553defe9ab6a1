"""``graphrun ingest --window N`` against ``--window 1`` (today's ``commit()`` a chunk)
into a 2-partition live store: the command's wall time, rows/s and CPU (issue 42,
ingest64; benchmarks/README.md, "Issue 42, ingest64").

    python benchmarks/ingest_window.py        # PARTS=/work/data/pl200k-parts EDGES=2000000
                                              # WINDOWS=1,8,1,8,1,8 CHUNK=10000
    PROFILE=FILE ...                          # cProfile of the command, written to FILE

``EDGES`` random edges between the base nodes (named by their original ids, as a user's
files name them) written once as npy (edges/src.npy, edges/dst.npy); then, for each
window in ``WINDOWS`` in turn, two fresh ``graphrun serve`` (one a partition,
``--live-dir``: the write-ahead log, as the bench's) and one ``graphrun ingest`` of the
whole file. Prints a JSON line a run: the window, the command's wall time, its rows/s
(its last line), its CPU-s (user + sys, a child's rusage) and each server's CPU-s during
it (/proc/PID/stat), and the load average.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PARTS = Path(os.environ.get("PARTS", "/work/data/pl200k-parts"))
EDGES = int(os.environ.get("EDGES", "2000000"))
WINDOWS = [int(w) for w in os.environ.get("WINDOWS", "1,8,1,8,1,8").split(",")]
CHUNK = int(os.environ.get("CHUNK", "10000"))
PROFILE = os.environ.get("PROFILE", "")  # a file: cProfile of the command (its last run)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one(d: Path, src: Path, window: int) -> dict[str, object]:
    """Fresh stores, one ingest of ``src`` with ``window``; its figures."""
    from graphrun.bench.live import _free_port
    from graphrun.local.stores import start_store

    live = d / f"live-{time.monotonic_ns()}"
    live.mkdir()
    extra = ["--clients", str(d / "clients"), "--live-dir", str(live)]
    addrs = [f"tcp://127.0.0.1:{_free_port()}" for _ in range(2)]
    stores = [start_store(PARTS, p, key_file=d / "store.key", address=addrs[p],
                          extra_args=extra, log_dir=d) for p in range(2)]  # fmt: skip
    try:
        prof = ["-m", "cProfile", "-o", PROFILE] if PROFILE else []
        cmd = [sys.executable, *prof, "-m", "graphrun", "ingest", str(src), "--key-file",
               str(d / "writer.key"), "--window", str(window), "--chunk-rows", str(CHUNK),
               "--progress-s", "3600", *[x for a in addrs for x in ("--store", a)]]  # fmt: skip
        servers0, cpu0, t0 = [cpu_s(s.pid) for s in stores], children_cpu(), time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
        servers = [round(cpu_s(s.pid) - c, 2) for s, c in zip(stores, servers0, strict=True)]
    finally:
        for s in stores:
            s.stop()
        shutil.rmtree(live, ignore_errors=True)
    rate = re.search(r"(\d+) rows/s committed", out)
    return {"window": window, "edges": EDGES, "chunk_rows": CHUNK, "wall_s": round(wall, 2),
            "rows_per_s": int(rate.group(1)) if rate else None, "ingest_cpu_s": round(cpu, 2),
            "server_cpu_s": servers, "load": os.getloadavg()[0],
            "last_line": out.strip()}  # fmt: skip


def main() -> None:
    from graphrun.bench.live import _keys
    from graphrun.partition import load_id_mapping

    d = Path(tempfile.mkdtemp(prefix="graphrun-ingest-window-"))
    try:
        _keys(d)
        orig = load_id_mapping(PARTS).orig_nids
        rng = np.random.default_rng(1)
        src = d / "new"
        (src / "edges").mkdir(parents=True)
        np.save(src / "edges" / "src.npy", orig[rng.integers(0, len(orig), EDGES)])
        np.save(src / "edges" / "dst.npy", orig[rng.integers(0, len(orig), EDGES)])
        for w in WINDOWS:
            print(json.dumps(one(d, src, w)), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
