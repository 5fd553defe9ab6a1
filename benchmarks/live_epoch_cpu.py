"""Where a training epoch's extra time goes while the live graph ingests (issue 42: an
epoch at most 10% slower while ingesting 100k edges/s): the epochs of ``graphrun bench
live``, undisturbed and ingesting, in turns on one pair of stores, each with the CPU of
every process and server thread it ran beside.

    PARTS=DIR python benchmarks/live_epoch_cpu.py     # DIR: pl200k in 2 parts (metis)
    ORDER=UIIUUIIU EPOCH_BATCHES=20 RATE=100000 PRE=81 HOSTS=netns THREADS=0 WARMUP=2 ...
    ORDER=UC ...      # C: undisturbed, both partitions compacting from its start (the
                      # delta is folded after it: what follows reads a compacted base)
    ORDER=UWIW ...    # W: the ingest alone for W_S seconds (4), no trainer: the
                      # servers' CPU of the write path at RATE without reads
    ORDER=UIBBIU ...  # B: a process burning the CPU the last ingesting epoch added (its
                      # own and the servers' over the last U's), 10 ms slices, no writes
    POLICIES=default,PASSIVE,spin20000 ...  # each epoch of ORDER once per OpenMP wait
                                    # policy, in turns (A B C, then C B A, ...), by a
                                    # trainer process of each: OMP_WAIT_POLICY unset
                                    # (libgomp's default), set (ACTIVE: spin for ever,
                                    # PASSIVE), or unset with GOMP_SPINCOUNT=N (spinN)
    REPLICAS=2 ...                  # each partition's replica on the other host (as
                                    # ``graphrun bench live --replicas 2``): every write
                                    # forwarded, the primary's loop waiting for its answer;
                                    # servers_cpu_s lists the replicas after the primaries
    STEP=0 ...                      # the loader alone, no model step: sampling and the
                                    # features' fetch, what a trainer's requests wait for
                                    # (``load_*_ms``: a batch's ``next()``)
    LAUNCHER="python wrap.py" ...   # argv before each server's ``python -m graphrun``
    PYTHONPATH=<older checkout> ... # run from outside the worktree (``-m`` puts the
                                    # working directory first on sys.path)

As ``graphrun bench live`` does (its functions): two ``graphrun serve`` with
``--live-dir`` (one per network-namespace host with ``HOSTS=netns``, the measuring
process on ``m0``), ``PRE`` commits of 10k new edges first (the bench's ingest and
staleness phases leave 81), then each letter of ``ORDER`` an epoch of GraphSAGE
(``EPOCH_BATCHES`` batches of 1,024 seeds, fanouts 10, 5, following the head, a fresh
context each, as the bench's ``_epoch``): ``U`` undisturbed, ``I`` while a second
process commits 10k-edge batches at ``RATE`` edges/s (started once, paused between
epochs). Prints one JSON line per epoch: its wall time, the time in the loader's
``next`` (sampling and the features' fetch) and in the step (forward, backward,
optimizer), the trainer's CPU (this process), each server's CPU by thread name
(user + system, ``/proc/PID/task``), the ingesting process's CPU, the edges it
committed, the compactions the servers finished, the servers' delta sizes, the
requests each primary served by op (``served``, its own calls for these included), the load,
and the batches' mean size (``batch_nodes_edges``: sampled nodes and edges, which the
graph's growth makes larger epoch after epoch, and the step with them).
``benchmarks/README.md``, "the epoch while ingesting, explained", has its runs.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from graphrun.bench import cpu_seconds as cpu_s

ORDER = os.environ.get("ORDER", "UIIUUIIU")
EPOCH_BATCHES = int(os.environ.get("EPOCH_BATCHES", "20"))
RATE = float(os.environ.get("RATE", "100000"))
PRE = int(os.environ.get("PRE", "81"))
HOSTS = os.environ.get("HOSTS", "netns")
THREADS = int(os.environ.get("THREADS", "0"))  # the trainer's torch threads (0: torch's)
BATCH = 10_000
WARMUP = int(os.environ.get("WARMUP", "2"))  # batches of the warm-up epoch
# argv before the servers' ``python -m graphrun serve`` (e.g. a profiling wrapper's)
LAUNCHER = os.environ.get("LAUNCHER", "").split()
W_S = float(os.environ.get("W_S", "4"))  # a ``W`` epoch's length: the ingest alone
POLICIES = [p for p in os.environ.get("POLICIES", "").split(",") if p]
REPLICAS = int(os.environ.get("REPLICAS", "1"))
STEP = os.environ.get("STEP", "1") != "0"  # 0: the loader alone


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread: ``main`` (the server's loop), ZMQ's by
    name, the others (the delta's merging thread, a compaction's) by thread id."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            if name == "python":
                name = "main" if task.name == str(pid) else f"t{task.name}"
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(v - a.get(k, 0.0), 3) for k, v in b.items() if v - a.get(k, 0.0) > 0}


def server_pid(proc: Any) -> int:
    """The ``graphrun serve`` process of a launcher (``ip netns exec`` ... ``exec``)."""
    pid = int(proc.pid)
    for _ in range(50):
        if (
            b"graphrun" in Path(f"/proc/{pid}/cmdline").read_bytes()
            and b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ):
            return pid
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not kids:
            time.sleep(0.1)
            continue
        pid = int(kids[0])
    return int(proc.pid)


def _helpers() -> tuple[Any, Any, Any]:
    """The bench's client, commit and edges (in graphrun.bench.live before 7fb6630)."""
    try:
        from graphrun.bench import live_epochs as m
    except ImportError:  # an older checkout on PYTHONPATH
        from graphrun.bench import live as old

        return old._client, old._commit, old._edges  # type: ignore[attr-defined]
    return m.client, m.commit, m.edges


def live_stats(admin: Any) -> list[dict[str, int]]:
    """Each partition's compactions so far and delta bytes (``live_compact``'s answer),
    and its primary's requests served so far by op (``served``)."""
    return [{**admin.session.call(p, "live_compact", {}, main_only=True).body,
             "served": admin.stats(p)["served"]} for p in range(2)]  # fmt: skip


def _served(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Requests served between two ``served`` counts, by op (the ops that moved)."""
    return {op: n - a.get(op, 0) for op, n in sorted(b.items()) if n != a.get(op, 0)}


def _ingester(cfg: dict[str, Any], ready: Any, go: Any, quit_: Any, sent: Any, burn: Any) -> None:
    """Commit 10k-edge batches at ``RATE`` while ``go`` is set; or, while ``burn`` holds a
    CPU share > 0, burn it in 10 ms slices."""
    client, commit, edges = _helpers()
    from graphrun.distributed.writer import GraphWriter

    rng = np.random.default_rng(3)
    with client(cfg, cfg["writer_key"]) as c:
        w, n = GraphWriter(c), c.book.num_nodes
        ready.set()
        while not quit_.is_set():
            if burn.value > 0:
                t0 = time.perf_counter()
                while burn.value > 0:
                    t = time.thread_time()
                    while time.thread_time() - t < 0.01 * burn.value:
                        pass
                    time.sleep(max(0.0, 0.01 - (time.perf_counter() - t0) % 0.01))
                continue
            if not go.wait(0.05):
                continue
            t0, mine = time.perf_counter(), 0
            while go.is_set():
                commit(w, *edges(rng, n, None, BATCH))
                mine += BATCH
                sent.value += BATCH
                ahead = t0 + mine / RATE - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)


def _epoch(cfg: dict[str, Any], batches: int = EPOCH_BATCHES) -> dict[str, Any]:
    """The bench's ``_epoch``, with the loader's and the step's time apart."""
    import torch
    from torch_geometric.nn import GraphSAGE

    from graphrun.distributed import DistGraph, DistNodeDataLoader, initialize
    from graphrun.rpc.auth import load_keys

    torch.manual_seed(0)
    if THREADS:
        torch.set_num_threads(THREADS)
    with initialize(cfg["addresses"], job="job", keys=load_keys(cfg["job_key"]), rank=0,
                    world_size=1, heartbeat_interval=0) as ctx:  # fmt: skip
        dg = DistGraph(ctx, follow="head")
        train = dg.mask_ids("train_mask")
        model = GraphSAGE(int(dg.ndata["feat"].shape[1]), 128, num_layers=2,
                          out_channels=int(cfg["classes"]))  # fmt: skip
        opt = torch.optim.Adam(model.parameters(), lr=0.003)
        loader = DistNodeDataLoader(dg, train, [10, 5], batch_size=1024, shuffle=True)
        it = iter(loader)
        load, step, sizes = [], [], np.zeros(2)  # sizes: sampled nodes, edges
        cpu = np.zeros(4)  # main thread in next(), process in next(), main in step, process
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(batches):
            t, a, p = time.perf_counter(), time.thread_time(), time.process_time()
            b = next(it)
            sizes += (b.num_nodes, b.num_edges)
            t1, a1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
            if STEP:
                opt.zero_grad()
                out = model(b.x, b.edge_index)[: b.batch_size]
                torch.nn.functional.cross_entropy(out, b.y[: b.batch_size]).backward()
                opt.step()
            cpu += (a1 - a, p1 - p, time.thread_time() - a1, time.process_time() - p1)
            load.append(t1 - t)
            step.append(time.perf_counter() - t1)
        wall, total = time.perf_counter() - t0, time.process_time() - c0
        del it
    return {"wall_s": round(wall, 3), "trainer_cpu_s": round(total, 3),
            "cpu_load_main_proc_step_main_proc": [round(float(x), 3) for x in cpu],
            "load_s": round(sum(load), 3), "step_s": round(sum(step), 3),
            "load_med_ms": round(1000 * float(np.median(load)), 1),
            "load_p90_ms": round(1000 * float(np.percentile(load, 90)), 1),
            "load_max_ms": round(1000 * max(load), 1),
            "step_med_ms": round(1000 * float(np.median(step)), 1),
            "batch_nodes_edges": [round(float(x) / batches, 1) for x in sizes]}  # fmt: skip


def _trainer(cfg: dict[str, Any], conn: Any) -> None:
    """A trainer process of its own (``POLICIES``): an epoch each time it is asked."""
    _epoch(cfg, WARMUP)
    conn.send("ready")
    while conn.recv() == "epoch":
        conn.send(_epoch(cfg))


def _trainers(ctx: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """A trainer process per ``POLICIES`` entry, started with ``OMP_WAIT_POLICY`` so."""
    out = {}
    for policy in POLICIES:
        here, there = ctx.Pipe()
        before = dict(os.environ)
        for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # read by the child's libgomp
            os.environ.pop(k, None)
        if policy.startswith("spin"):
            os.environ["GOMP_SPINCOUNT"] = policy[4:]
        elif policy != "default":
            os.environ["OMP_WAIT_POLICY"] = policy
        ctx.Process(target=_trainer, args=(cfg, there), daemon=True).start()
        os.environ.clear()
        os.environ.update(before)
        assert here.recv() == "ready"
        out[policy] = here
    return out


def drive(cfg: dict[str, Any]) -> None:
    import torch

    client, _, edges = _helpers()
    from graphrun.distributed.writer import GraphWriter
    from graphrun.local.stores import start_store
    from graphrun.rpc.auth import load_keys
    from graphrun.store.client import ClientConfig, KVClient

    stores = [start_store(cfg["parts_dir"], p, **cfg["store_kwargs"][p]) for p in range(2)]
    if REPLICAS == 2:
        from graphrun.bench.live import _start_replicas

        _start_replicas(cfg, stores)
    pids = [server_pid(s.proc) for s in stores]  # the primaries', then the replicas'
    ctx = mp.get_context("spawn")
    go, quit_, sent, burn = ctx.Event(), ctx.Event(), ctx.Value("d", 0.0), ctx.Value("d", 0.0)
    proc, trainers = None, {}
    try:
        admin = KVClient(ClientConfig(cfg["addresses"], job="ops",
                                      keys=load_keys(cfg["store_key"])))  # fmt: skip
        rng = np.random.default_rng(1)
        with client(cfg, cfg["writer_key"]) as c:
            w = GraphWriter(c, window=4)
            for _ in range(PRE):
                w.add_edges("_E", *edges(rng, c.book.num_nodes, None, BATCH))
                w.submit()
            w.flush()
            w.close()
        ready = ctx.Event()
        proc = ctx.Process(target=_ingester, args=(cfg, ready, go, quit_, sent, burn))
        proc.start()
        ready.wait(300)
        trainers.update(_trainers(ctx, cfg) if POLICIES else {})
        if not POLICIES:
            _epoch(cfg, WARMUP)  # warm-up (the bench's: 2 batches)
        last_ingest_share, quiet_servers = 0.0, 0.0  # CPU-s a second: ingest's, U's servers'
        turns = [(kind, None) for kind in ORDER]
        if POLICIES:  # each epoch once per policy, the first of them in turn
            turns = [(k, pol) for i, k in enumerate(ORDER)
                     for pol in (POLICIES if i % 2 == 0 else POLICIES[::-1])]  # fmt: skip
        for i, (kind, policy) in enumerate(turns):
            time.sleep(1.0)
            p0 = [cpu_s(p) for p in pids]
            s0 = [threads_cpu(p) for p in pids]
            i0, e0 = cpu_s(proc.pid), sent.value
            stats0 = live_stats(admin)
            if kind in "IW":
                go.set()
                time.sleep(1.0)  # the ingest is under way (the bench's second)
                p0 = [cpu_s(p) for p in pids]
                s0 = [threads_cpu(p) for p in pids]
                i0, e0 = cpu_s(proc.pid), sent.value
            elif kind == "C":  # a compaction of both partitions starts with the epoch
                for p in range(2):
                    admin.session.call(p, "live_compact", {"start": True}, main_only=True)
            elif kind == "B":
                burn.value = last_ingest_share
                time.sleep(1.0)
                p0 = [cpu_s(p) for p in pids]
                s0 = [threads_cpu(p) for p in pids]
                i0 = cpu_s(proc.pid)
            t0 = time.perf_counter()
            if kind == "W":  # the ingest alone: no trainer, as long as an epoch
                time.sleep(W_S)
                rec = {"wall_s": W_S}
            elif policy is None:
                rec = _epoch(cfg)
            else:
                trainers[policy].send("epoch")
                rec = {**trainers[policy].recv(), "policy": policy}
            span = time.perf_counter() - t0
            p1 = [cpu_s(p) for p in pids]
            s1 = [threads_cpu(p) for p in pids]
            i1, e1 = cpu_s(proc.pid), sent.value
            go.clear()
            burn_share, burn.value = burn.value, 0.0
            stats1 = live_stats(admin)
            servers = [_diff(a, b) for a, b in zip(s0, s1, strict=True)]
            busy = sum(b - a for a, b in zip(p0, p1, strict=True))
            if kind == "U":
                quiet_servers = busy / span
            if kind == "I":  # what the ingest added: the writer's and the servers' extra
                last_ingest_share = max(0.0, (i1 - i0) / span + busy / span - quiet_servers)
            rec.update({
                "i": i, "kind": kind, "span_s": round(span, 3),
                "servers_cpu_s": [round(b - a, 3) for a, b in zip(p0, p1, strict=True)],
                "burn_share": round(burn_share, 3),
                "server_threads_cpu_s": servers,
                "ingester_cpu_s": round(i1 - i0, 3),
                "edges_committed": int(e1 - e0),
                "compactions": [b["compactions"] - a["compactions"]
                                for a, b in zip(stats0, stats1, strict=True)],
                "delta_mb": [round(b["delta_bytes"] / 2**20) for b in stats1],
                "served": [_served(a["served"], b["served"])
                           for a, b in zip(stats0, stats1, strict=True)],
                "torch_threads": torch.get_num_threads(),
                "load_avg": os.getloadavg()[0],
            })  # fmt: skip
            print(json.dumps(rec), flush=True)
        admin.close()
    finally:
        for conn in trainers.values():
            conn.send("stop")
        quit_.set()
        go.clear()
        burn.value = 0.0
        if proc is not None:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        _stop_all(stores)


def _stop_all(stores: list[Any]) -> None:
    """Stop every store, each whatever the others did (one whose stop timed out on a
    loaded box left the rest serving in their network namespaces), then raise the first
    failure."""
    failed: list[BaseException] = []
    for s in stores:
        try:
            s.stop()
        except Exception as exc:  # the next stores still stop
            failed.append(exc)
            s.proc.kill()
    if failed:
        raise failed[0]


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--drive":
        drive(json.loads(Path(sys.argv[2]).read_text()))
        return
    import argparse

    from graphrun.bench.live import _config, _free_port, _keys
    from graphrun.local.netns import NetnsNetwork

    d = Path(tempfile.mkdtemp(prefix="graphrun-epoch-cpu-"))
    try:
        # hard links: a compaction writes part-K.c<C> and a pointer beside, never into, them
        subprocess.run(["cp", "-al", os.environ["PARTS"], str(d / "parts")], check=True)
        _keys(d)
        args = argparse.Namespace(replicas=REPLICAS, batch=BATCH, batches=1, probes=1, window=4,
                                  rate=RATE, fanout_list=[10, 5], batch_size=1024,
                                  epoch_batches=EPOCH_BATCHES, kill_after=1, lose=None,
                                  epoch_pairs=1, threads=THREADS)  # fmt: skip
        classes = SimpleNamespace(node_types=["_N"], ndata={"_N": {"label": np.arange(47)}})
        local = [(f"tcp://127.0.0.1:{_free_port()}", ()) for _ in range(2)]
        cfg = _config(args, d, classes, local)  # type: ignore[arg-type]  # 47 classes
        cfg["store_key"] = str(d / "store.key")
        if HOSTS == "local":
            (d / "drive.json").write_text(json.dumps(cfg))
            drive(cfg)
            return
        with NetnsNetwork(["m0", "m1"]) as net:
            for p in range(2):
                m = f"m{p}"
                cfg["addresses"][p] = f"tcp://{net.address(m)}:{_free_port()}"
                cfg["store_kwargs"][p]["address"] = cfg["addresses"][p]
                cfg["store_kwargs"][p]["launcher"] = [*net.prefix(m), *LAUNCHER]
            for p, kw in enumerate(cfg.get("replica_kwargs", [])):  # on the other host
                m = f"m{(p + 1) % 2}"
                kw["address"] = f"tcp://{net.address(m)}:{_free_port()}"
                kw["launcher"] = [*net.prefix(m), *LAUNCHER]
            (d / "drive.json").write_text(json.dumps(cfg))
            cmd = [*net.prefix("m0"), sys.executable, __file__, "--drive", str(d / "drive.json")]
            subprocess.run(cmd, check=True, env={**os.environ})
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
