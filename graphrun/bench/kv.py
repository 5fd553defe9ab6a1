"""``graphrun bench kv``: KV store pull/push throughput and latency (prints one JSON object).

Builds a one-partition graph whose node feature is a ``rows x dim`` float32 table
(default 200k x 100), serves it with a real ``graphrun serve`` process, and measures:

* ``numpy_gather_GBps``  ``table[ids]`` on an in-memory array in this process (reference)
* ``local_pull_GBps``    a co-located client (shared memory) pulling the same ids
* ``remote_pull_GBps``   a client over TCP loopback (no shared memory), CURVE-encrypted;
                         ``remote_pull_plain_GBps`` the same without CURVE
* ``pull_p50_ms``/``pull_p99_ms``  latency of a 100-row remote pull (``local_pull_p50_ms``)
* ``push_GBps``          ``add``-reducer pushes of 10k rows; ``adagrad_rows_per_s`` and
                         ``adam_rows_per_s`` for the sparse optimizer reducers
* ``netns``              the remote numbers between two network namespaces joined by a
                         veth pair (10.x addresses), when run as root with ``ip netns``

Throughputs count the payload bytes (rows x dim x 4) per second, median over repeats,
for random ids in batches of ``--batches`` (the headline keys use the largest batch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.bench import call_times, check_at_least, int_list
from graphrun.errors import GraphrunError

if TYPE_CHECKING:
    from graphrun.store.client import KVClient

FEAT = "node/_N/feat"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "kv",
        help="KV store pull/push throughput and latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rows", type=int, default=200_000, help="table rows (default %(default)s)")
    p.add_argument("--dim", type=int, default=100, help="row width (default %(default)s)")
    p.add_argument(
        "--batches", default="10000,100000", help="pull batch sizes (default %(default)s)"
    )
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per batch size")
    p.add_argument("--netns", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--client-only", metavar="ADDRESS", help=argparse.SUPPRESS)
    p.add_argument("--key-file", type=Path, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _median_gbps(fn: Any, nbytes: int, repeats: int) -> float:
    return nbytes / statistics.median(call_times(fn, repeats)) / 1e9


def _latency_ms(fn: Any, n: int = 300) -> tuple[float, float]:
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def _pull_numbers(client: Any, rows: int, dim: int, batches: list[int], repeats: int) -> dict:
    rng = np.random.default_rng(1)
    out: dict[str, Any] = {}
    for b in batches:
        ids = rng.integers(0, rows, b)
        out[str(b)] = round(
            _median_gbps(lambda i=ids: client.pull(FEAT, i), b * dim * 4, repeats), 3
        )
    small = rng.integers(0, rows, 100)
    p50, p99 = _latency_ms(lambda: client.pull(FEAT, small))
    return {"GBps": out, "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}


def _push_numbers(client: Any, rows: int, dim: int, repeats: int) -> dict[str, float]:
    from graphrun.store.reducers import STATE_SPECS

    rng = np.random.default_rng(2)
    client.init_tensor("bench_w", "node:_N", (dim,), exist_ok=True)
    ids = rng.integers(0, rows, 10_000)
    vals = rng.random((len(ids), dim), dtype=np.float32)
    push = _median_gbps(lambda: client.push("bench_w", ids, vals, "add"), vals.nbytes, repeats)
    res = {"push_GBps": round(push, 3)}
    for red in ("sparse_adagrad", "sparse_adam"):
        states = []
        for suffix, full in STATE_SPECS[red]:
            name = f"bench_w.{red}.{suffix}"
            client.init_tensor(name, "node:_N", (dim,) if full else (), exist_ok=True)
            states.append(name)
        gbps = _median_gbps(
            lambda r=red, s=states: client.push("bench_w", ids, vals, r, {"lr": 0.01}, s),
            vals.nbytes,
            repeats,
        )
        res[f"{red.removeprefix('sparse_')}_rows_per_s"] = round(gbps * 1e9 / (dim * 4))
    return res


def _local_vs_numpy(
    client: Any, parts: Path, rows: int, dim: int, batches: list[int], repeats: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Co-located pulls and the reference (fancy indexing of an in-memory copy of the
    table in this process) on the same ids, timed alternately so load hits both alike."""
    rng = np.random.default_rng(1)
    table = np.array(np.load(parts / "part-0" / "node" / "_N" / "feat.npy"))
    local, ref = {}, {}
    for b in batches:
        ids = rng.integers(0, rows, b)
        t_local: list[float] = []
        t_ref: list[float] = []
        client.pull(FEAT, ids), table[ids]  # warm-up
        for _ in range(repeats):
            t = time.perf_counter()
            client.pull(FEAT, ids)
            t_local.append(time.perf_counter() - t)
            t = time.perf_counter()
            table[ids]
            t_ref.append(time.perf_counter() - t)
        local[str(b)] = round(b * dim * 4 / statistics.median(t_local) / 1e9, 3)
        ref[str(b)] = round(b * dim * 4 / statistics.median(t_ref) / 1e9, 3)
    return local, ref


def _client(addresses: list[str], keys: Any, use_shm: bool) -> KVClient:
    from graphrun.store.client import ClientConfig, KVClient

    return KVClient(ClientConfig(addresses, job="bench", keys=keys, use_shm=use_shm, timeout=60))


def _remote(address: str, key_file: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    from graphrun.rpc.auth import load_keys

    keys = load_keys(key_file) if key_file else None
    batches = int_list("--batches", args.batches)
    with _client([address], keys, use_shm=False) as c:
        return _pull_numbers(c, args.rows, args.dim, batches, args.repeats)


def _make_partition(tmp: Path, rows: int, dim: int) -> Path:
    from graphrun.graph import Graph
    from graphrun.partition import partition_graph

    rng = np.random.default_rng(0)
    src = rng.integers(0, rows, rows).astype(np.int64)
    dst = rng.integers(0, rows, rows).astype(np.int64)
    feat = rng.random((rows, dim), dtype=np.float32)
    g = Graph(num_nodes=rows, src=src, dst=dst, ndata={"_N": {"feat": feat}}, name="bench")
    partition_graph(g, tmp / "parts", 1, method="random")
    return tmp / "parts"


def _netns_numbers(parts: Path, key_file: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Server in namespace A, client in namespace B, joined by one veth pair."""
    from graphrun.local.machines import package_env
    from graphrun.local.netns import NetnsNetwork
    from graphrun.local.stores import start_store

    with NetnsNetwork(["a", "b"], own_hostnames=False) as net:
        address = f"tcp://{net.address('a')}:0"
        store = start_store(parts, 0, key_file=key_file, address=address, launcher=net.prefix("a"))
        try:
            cmd = [*net.prefix("b"), sys.executable, "-m", "graphrun", "bench", "kv"]
            cmd += ["--client-only", store.address, "--key-file", str(key_file)]
            cmd += ["--rows", str(args.rows), "--dim", str(args.dim), "--batches", args.batches]
            cmd += ["--repeats", str(args.repeats)]
            env = {**os.environ, **package_env()}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                raise GraphrunError(f"netns client exited with {out.returncode}: {out.stderr}")
            result: dict[str, Any] = json.loads(out.stdout)
            return result
        finally:
            store.stop()


def run(args: argparse.Namespace) -> int:
    from graphrun.rpc.tuning import keep_large_allocations

    check_at_least(args, 1, "--rows", "--dim", "--repeats")
    batches = int_list("--batches", args.batches)
    keep_large_allocations()
    if args.client_only:
        print(json.dumps(_remote(args.client_only, args.key_file, args)))
        return 0
    from graphrun.local.netns import unavailable_reason
    from graphrun.local.stores import start_store
    from graphrun.rpc.auth import generate_keys

    rows, dim = args.rows, args.dim
    result: dict[str, Any] = {"bench": "kv", "rows": rows, "dim": dim, "batches": batches}
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="graphrun-bench-kv-") as tmpdir:
        tmp = Path(tmpdir)
        parts = _make_partition(tmp, rows, dim)
        key_file = tmp / "job.key"
        keys = generate_keys(key_file)
        big = str(batches[-1])
        store = start_store(parts, 0, key_file=key_file)
        plain = start_store(parts, 0)
        try:
            with _client([store.address], keys, use_shm=True) as c:
                if c.local_parts != [0]:
                    raise RuntimeError("the co-located client cannot map the shared memory")
                local = _pull_numbers(c, rows, dim, batches, 1)  # latency
                local["GBps"], numpy_g = _local_vs_numpy(c, parts, rows, dim, batches, args.repeats)
                result.update(_push_numbers(c, rows, dim, args.repeats))
            remote = _remote(store.address, key_file, args)
            remote_plain = _remote(plain.address, None, args)
        finally:
            store.stop()
            plain.stop()
        result.update(
            {
                "numpy_gather_GBps": numpy_g[big],
                "local_pull_GBps": local["GBps"][big],
                "local_vs_numpy": round(local["GBps"][big] / numpy_g[big], 3),
                "remote_pull_GBps": remote["GBps"][big],
                "remote_pull_plain_GBps": remote_plain["GBps"][big],
                "pull_p50_ms": remote["p50_ms"],
                "pull_p99_ms": remote["p99_ms"],
                "local_pull_p50_ms": local["p50_ms"],
                "local_pull_p99_ms": local["p99_ms"],
                "by_batch": {
                    "numpy_gather_GBps": numpy_g,
                    "local_pull_GBps": local["GBps"],
                    "remote_pull_GBps": remote["GBps"],
                    "remote_pull_plain_GBps": remote_plain["GBps"],
                },
            }
        )
        want = args.netns == "yes" or (args.netns == "auto" and unavailable_reason() is None)
        if want:
            ns = _netns_numbers(parts, key_file, args)
            result["netns"] = {"remote_pull_GBps": ns["GBps"][big], **ns}
    print(json.dumps(result))
    return 0
