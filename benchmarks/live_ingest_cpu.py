"""CPU time per write batch of a single writer into a 2-partition live store (issue 42,
ingest rate): where a batch's time goes, measured as CPU time (a loaded box's wall time
says little).

    python benchmarks/live_ingest_cpu.py            # BATCHES=150 BATCH=10000 WINDOW=0
                                                    # (WINDOW=0: commit(), runs on older code)
    WINDOW=4 python benchmarks/live_ingest_cpu.py   # GraphWriter(window=4): submit/flush
    PROFILE=1 SORT=tottime ...                      # cProfile of the writer (CPU time)
    SPY=1 ... (SPY=gil: the GIL's holder only)      # py-spy raw profiles of both servers
    SPY=gil SPY_RATE=1000 ...                       # sampled 1000 times a second
    PERF=1 ...                                      # perf record -g of both servers (CPU
                                                    # samples, kernel too: perf-PID.data)
    PERF=all ...                                    # perf record -g of the writer and
                                                    # every server (perf-all-PID.data)
    TIDS=1 ...                                      # each server thread's CPU, named
    TUNE=0 ...                                      # without keep_large_allocations
    RATE=100000 ...                                 # paced: a batch every BATCH/RATE s
                                                    # (as graphrun bench live's ingest)
    RATE=100000 SPIN=1 ...                          # paced by spinning, not sleeping
    IDLE=1 ...                                      # first, the servers' CPU idle for
                                                    # as long (what a paced batch's
                                                    # figures include without its work)
    TIMERS=DIR ... (PYTHONPATH=benchmarks/timers:...)  # thread CPU by function in each
                                                    # server (benchmarks/timers/)
    PARTS=DIR ...                                   # a 2-partition directory instead (as
                                                    # `graphrun bench live --dataset`'s)
    REPLICAS=2 ...                                  # a replica of each partition too (its
                                                    # servers listed after the primaries)
    COMPACT=1 ...                                   # then each server compacts, in turn:
                                                    # its CPU-s, build and pause s
    NETNS=1 ... (root)                              # as `graphrun bench live --hosts
                                                    # netns`: partition p's primary on
                                                    # host m<p>, its replica on the other,
                                                    # the writer on m0 (veths, a bridge)

A 20k-node power-law graph (``community``), 2 random partitions, one ``graphrun serve``
per partition with ``--live-dir`` (the write-ahead log), a writer key; ``BATCHES``
commits of ``BATCH`` new edges between random base nodes after one warm-up batch.
Prints JSON: the writer's CPU ms per batch (``time.process_time``: all its threads,
ZMQ's I/O thread included; per thread; and its main thread's inside the batches alone,
``main_thread_ms_per_batch``, without the pacing's sleep or spin), each server's
(``/proc/PID/stat``) and per thread (user, system; ``/proc/PID/task``), edges per CPU
second (a server's half of each batch; the writer's whole batch), each server's requests
a batch by op, its log's syncs and its delta's index entries written a batch (each
server's, replicas too: its ``stats``, asked with the store's key),
the wall time and the load average, and the box's CPU over the batches from
``/proc/stat`` (``box_cores``: cores busy by kind, idle included; a saturated box shows
no idle) and every other process's (``others_cpu_s``; a kernel worker's own figure there
can exceed what ``/proc/stat`` says the box spent: read it as a hint, not CPU), and every
server's log syncs a batch (``log_syncs_per_batch_every_server``, replicas too)
(benchmarks/README.md, "Issue 42, thru64"), the KB its log's records took a batch
(``log_kb_per_batch_every_server``; 0 from code before wire65) and the writer's requests
a batch by op: their count and KB (``request_kb_per_batch``: header and tensor frames as
encoded, before CURVE; a primary forwards the same frames to its replica) ("Issue 42,
wire65").
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BATCHES = int(os.environ.get("BATCHES", "150"))
BATCH = int(os.environ.get("BATCH", "10000"))
WINDOW = int(os.environ.get("WINDOW", "0"))
RATE = float(os.environ.get("RATE", "0"))  # edges/s; 0: full speed
REPLICAS = int(os.environ.get("REPLICAS", "1"))


def box_cpu() -> list[int]:
    """The box's CPU ticks so far by kind (``/proc/stat``'s first line)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


BOX_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def box_cores(before: list[int], after: list[int], wall: float) -> dict[str, float]:
    """Cores spent in each kind over ``wall`` seconds (all cores: their sum is ~nproc)."""
    tick = os.sysconf("SC_CLK_TCK")
    return {k: round((b - a) / tick / wall, 3)
            for k, a, b in zip(BOX_KINDS, before, after, strict=False)}  # fmt: skip


def all_cpu() -> dict[str, float]:
    """Every process's CPU seconds so far, by ``pid:name`` (what else ran on the box)."""
    out = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                head, tail = (proc / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            out[f"{proc.name}:{head.split('(', 1)[1]}"] = cpu_s_of(tail)
    return out


def others(before: dict[str, float], after: dict[str, float], ours: set[int]) -> dict:
    """The processes besides the writer and its servers that took CPU over the batches
    (their CPU seconds, the top 6), and all of them together."""
    took = {k: v - before.get(k, 0.0) for k, v in after.items()
            if int(k.split(":")[0]) not in ours}  # fmt: skip
    top = sorted(took.items(), key=lambda kv: -kv[1])[:6]
    return {"others_cpu_s": round(sum(took.values()), 3),
            "others_top": {k: round(v, 3) for k, v in top if v > 0}}  # fmt: skip


def enter_netns(name: str, hostname: bytes) -> None:
    """This process into network namespace ``name`` under ``hostname``, as `ip netns
    exec` and `unshare --uts` put the bench's measuring process (before any socket or
    ZMQ thread: namespaces are per thread, and new threads inherit their creator's)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{name}") as f:
        if libc.setns(f.fileno(), 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns {name}")
    if libc.unshare(0x04000000) != 0 or libc.sethostname(hostname, len(hostname)) != 0:
        raise OSError(ctypes.get_errno(), "unshare --uts")  # CLONE_NEWUTS


def cpu_s_of(stat_tail: str) -> float:
    fields = stat_tail.split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    return cpu_s_of(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1])


def settled(pids: list[int]) -> list[float]:
    """The servers' CPU once it stops moving: the delta's merging thread may still be
    indexing the last commits (their cost is the batches')."""
    now = [cpu_s(p) for p in pids]
    while True:
        time.sleep(0.5)
        then, now = now, [cpu_s(p) for p in pids]
        if all(b - a < 0.02 for a, b in zip(then, now, strict=True)):
            return then


def threads_cpu(pid: int) -> dict[str, list[float]]:
    """Per thread name: [user s, system s, minor faults, voluntary and involuntary
    context switches, s waiting on a run queue (``schedstat``: runnable, not running)]
    (threads of one name summed)."""
    out: dict[str, list[float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            name += f"/{task.name}" if os.environ.get("TIDS") else ""
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(x.split(":", 1) for x in (task / "status").read_text().splitlines())
            queued = int((task / "schedstat").read_text().split()[1]) / 1e9
        except OSError:
            continue
        acc = out.setdefault(name, [0.0] * 6)
        acc[0] += int(fields[11]) / tick
        acc[1] += int(fields[12]) / tick
        acc[2] += int(fields[7]) / 1000  # per batch below: faults, not ms
        acc[3] += int(status["voluntary_ctxt_switches"]) / 1000  # switches, likewise
        acc[4] += int(status["nonvoluntary_ctxt_switches"]) / 1000
        acc[5] += queued
    return out


def per_batch(
    before: dict[str, list[float]], after: dict[str, list[float]]
) -> dict[str, list[float]]:
    zero = [0.0] * 6
    return {k: [round(1000 * (a - b) / BATCHES, 2)
                for a, b in zip(v, before.get(k, zero), strict=True)]
            for k, v in after.items() if v != before.get(k, zero)}  # fmt: skip


def idle_cpu(pids: list[int]) -> dict[str, object]:
    """``IDLE=1``: the servers' CPU while no batch comes, over as long as the paced
    batches take (``BATCHES * BATCH / RATE`` s; 15 s at full speed), per batch interval:
    what a server costs idle (its loop's wake-ups, the connection guard's checks), which
    a paced batch's figures include."""
    span = BATCHES * BATCH / RATE if RATE else 15.0
    s0, t0 = [cpu_s(p) for p in pids], [threads_cpu(p) for p in pids]
    time.sleep(span)
    s1, t1 = [cpu_s(p) for p in pids], [threads_cpu(p) for p in pids]
    return {
        "idle_s": span,
        "idle_server_cpu_ms_per_batch": [round(1000 * (b - a) / BATCHES, 2)
                                         for a, b in zip(s0, s1, strict=True)],
        "idle_threads_ms_user_sys_faults_switches": [per_batch(a, b)
                                                     for a, b in zip(t0, t1, strict=True)],
    }  # fmt: skip


def index_work(address: str, d: Path) -> tuple[int, int, int]:
    """The index entries a server's delta wrote so far, its log's syncs and the bytes of
    its records (its ``stats``, the store's key: replicas too; 0 where older code does
    not say)."""
    from graphrun.rpc.auth import load_keys
    from graphrun.rpc.transport import RpcClient

    with RpcClient(address, keys=load_keys(d / "store.key"), timeout=10) as c:
        live = c.call("stats").body["live"]
        return (int(live.get("index_work", 0)), int(live.get("log_syncs", 0)),
                int(live.get("log_bytes", 0)))  # fmt: skip


def count_request_bytes() -> dict[str, list[int]]:
    """Count the bytes of every request this process encodes, by op (its frames: header
    and tensors; what the writer sends, and each primary forwards to its replica)."""
    from graphrun.rpc import codec, transport

    sent: dict[str, list[int]] = {}
    encode = codec.encode

    def counted(msg: codec.Message) -> list:
        frames = encode(msg)
        if msg.kind == codec.MsgKind.REQUEST:
            n = sent.setdefault(msg.op, [0, 0])
            n[0] += 1
            n[1] += sum(memoryview(f).nbytes for f in frames)
        return frames

    transport.encode = counted  # type: ignore[attr-defined]
    return sent


def compacted(stores: list, d: Path) -> list[dict[str, object]]:
    """COMPACT=1: every server (replicas too) compacts what the batches wrote, one at a
    time; each one's CPU seconds for it (settled after), build and pause seconds."""
    from graphrun.rpc.auth import load_keys
    from graphrun.rpc.transport import RpcClient

    out = []
    for s in stores:
        c0 = settled([s.proc.pid])[0]
        with RpcClient(s.address, keys=load_keys(d / "store.key"), timeout=60) as c:
            st = c.call("live_compact", {"start": True}).body
            while st["running"]:
                time.sleep(0.05)
                st = c.call("live_compact", {}).body
        out.append({"cpu_s": round(settled([s.proc.pid])[0] - c0, 3), "build_s": st["build_s"],
                    "pause_s": st["pause_s"], "version": st["version"],
                    "error": st["error"]})  # fmt: skip
    return out


def start_servers(parts: Path, d: Path, net: object, stores: list) -> list[str]:
    """Both partitions' servers (``REPLICAS=2``: and a replica of each, registered with
    its primary before any client joins), appended to ``stores`` as they start; the
    primaries' addresses. With ``net`` (``NETNS=1``) as `graphrun bench live --hosts
    netns` places them: partition p's primary on host m<p>, its replica on the other
    host, each host its own log directory, and this process joins host m0."""
    from graphrun.bench.live import _free_port
    from graphrun.local.stores import start_store

    def on(m: int) -> tuple[str, dict]:
        live = d / (f"live-m{m}" if net else "live")
        live.mkdir(exist_ok=True)
        host = net.address(f"m{m}") if net else "127.0.0.1"  # type: ignore[attr-defined]
        kw = {"key_file": d / "store.key", "log_dir": d,
              "launcher": net.prefix(f"m{m}") if net else (),  # type: ignore[attr-defined]
              "extra_args": ["--clients", str(d / "clients"), "--live-dir", str(live)]}  # fmt: skip
        return f"tcp://{host}:{_free_port()}", kw

    addrs = []
    for p in range(2):
        address, kw = on(p)
        addrs.append(address)
        stores.append(start_store(parts, p, address=address, **kw))
    for p in range(2 if REPLICAS == 2 else 0):
        address, kw = on((p + 1) % 2)
        kw["extra_args"] += ["--replica-of", addrs[p]]
        stores.append(start_store(parts, p, **({"address": address} if net else {}), **kw))
    if net:
        m0 = net.hosts["m0"]  # type: ignore[attr-defined]
        enter_netns(m0.namespace, m0.hostname.encode())
    return addrs


def main() -> None:
    from graphrun.bench.live import _keys
    from graphrun.distributed.writer import GraphWriter
    from graphrun.graph import GenParams, community
    from graphrun.local.netns import NetnsNetwork
    from graphrun.partition import partition_graph
    from graphrun.rpc.auth import load_keys
    from graphrun.store.client import ClientConfig, KVClient

    if os.environ.get("TUNE", "1") == "1":
        from graphrun.rpc.tuning import keep_large_allocations

        keep_large_allocations()  # as graphrun ingest and graphrun bench do
    d = Path(tempfile.mkdtemp(prefix="graphrun-ingest-cpu-"))
    parts = Path(os.environ["PARTS"]) if os.environ.get("PARTS") else d / "parts"
    if not os.environ.get("PARTS"):
        graph = community(GenParams(nodes=20000, avg_degree=10, exponent=2.1, feat_dim=16,
                                    classes=5))  # fmt: skip
        partition_graph(graph, parts, 2, "random")
    _keys(d)
    net = NetnsNetwork(["m0", "m1"]).open() if os.environ.get("NETNS") else None
    stores: list = []
    spies = []
    requests = count_request_bytes()
    try:
        addrs = start_servers(parts, d, net, stores)
        keys = load_keys(d / "writer.key")
        admin = KVClient(ClientConfig(addrs, job="ops", keys=load_keys(d / "store.key")))
        with KVClient(ClientConfig(addrs, job="writer", keys=keys, timeout=60)) as c:
            w = GraphWriter(c, window=WINDOW) if WINDOW else GraphWriter(c)  # 0: as before
            n = c.book.num_nodes
            rng = np.random.default_rng(1)
            data = [(rng.integers(0, n, BATCH), rng.integers(0, n, BATCH))
                    for _ in range(BATCHES + 1)]  # fmt: skip

            def one(src: np.ndarray, dst: np.ndarray) -> None:
                tt = time.thread_time()
                w.add_edges("_E", src, dst)
                w.submit() if WINDOW else w.commit()
                inbatch[0] += time.thread_time() - tt
                if RATE and os.environ.get("SPIN"):
                    target = start[0] + (done[0] + 1) * BATCH / RATE
                    done[0] += 1
                    while time.perf_counter() < target:
                        pass
                elif RATE:  # paced as graphrun bench live's ingesting process is
                    ahead = start[0] + (done[0] + 1) * BATCH / RATE - time.perf_counter()
                    done[0] += 1
                    if ahead > 0:
                        time.sleep(ahead)

            start, done, inbatch = [time.perf_counter()], [0], [0.0]

            one(*data[0])
            if WINDOW:
                w.flush()
            if os.environ.get("SPY"):
                for s in stores:
                    out = d.parent / f"spy-{s.proc.pid}.txt"
                    rate = os.environ.get("SPY_RATE", "200")  # samples a second
                    cmd = ["py-spy", "record", "-r", rate, "-f", "raw", "-o", str(out),
                           "-p", str(s.proc.pid)]  # fmt: skip
                    cmd += ["--gil"] if os.environ["SPY"] == "gil" else []
                    cmd += ["--nonblocking"]  # a paused server's switches are not its own
                    spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
                time.sleep(1)
            if os.environ.get("PERF") == "all":  # writer and servers, kernel too: one file
                pids = ",".join(str(p) for p in [os.getpid(), *(s.proc.pid for s in stores)])
                cmd = ["perf", "record", "-F", "1000", "-g", "-p", pids, "-o",
                       str(d.parent / f"perf-all-{os.getpid()}.data")]  # fmt: skip
                print(f"perf: pids {pids}", file=sys.stderr)
                spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))  # fmt: skip
                time.sleep(1)
            elif os.environ.get("PERF"):  # samples on CPU only (py-spy's include waits)
                for s in stores:
                    out = d.parent / f"perf-{s.proc.pid}.data"
                    cmd = ["perf", "record", "-F", "2000", "-g", "-o", str(out),
                           "-p", str(s.proc.pid)]  # fmt: skip
                    spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL))  # fmt: skip
                time.sleep(1)
            if os.environ.get("TIDS") and shutil.which("py-spy"):
                for s in stores:
                    dump = subprocess.run(["py-spy", "dump", "-p", str(s.proc.pid)],
                                          capture_output=True, text=True).stdout
                    print("\n".join(x for x in dump.splitlines() if x.startswith("Thread")))
            # the window starts once the servers are idle: a merging thread may still be
            # loading its compiled merge (numba, about 0.5 CPU-s, a start-up cost), and a
            # window that began meanwhile charged it to the batches
            settled([s.proc.pid for s in stores])
            idle = idle_cpu([s.proc.pid for s in stores]) if os.environ.get("IDLE") else {}
            served0 = [admin.stats(p)["served"] for p in range(2)]
            syncs0 = [admin.stats(p)["live"]["log_syncs"] for p in range(2)]
            work0 = [index_work(s.address, d) for s in stores]
            s0 = [cpu_s(s.proc.pid) for s in stores]
            t_0 = [threads_cpu(s.proc.pid) for s in stores]
            prof = cProfile.Profile(time.thread_time) if os.environ.get("PROFILE") else None
            me0 = threads_cpu(os.getpid())
            all0 = all_cpu()
            t0, c0, box0 = time.perf_counter(), time.process_time(), box_cpu()
            start[0], done[0], inbatch[0] = t0, 0, 0.0
            requests.clear()
            if prof is not None:
                prof.enable()
            for src, dst in data[1:]:
                one(src, dst)
            if WINDOW:
                w.flush()
            if prof is not None:
                prof.disable()
            wall, wcpu = time.perf_counter() - t0, time.process_time() - c0
            requests = dict(requests)  # the batches' (not the stats asked after)
            box1, all1 = box_cpu(), all_cpu()
            me1 = threads_cpu(os.getpid())
            s1 = settled([s.proc.pid for s in stores])
            if os.environ.get("TIMERS"):  # benchmarks/timers: each server's timers, written
                for s in stores:
                    os.kill(s.proc.pid, signal.SIGUSR1)
                time.sleep(2)
            t_1 = [threads_cpu(s.proc.pid) for s in stores]
            served = [{op: round((n - before.get(op, 0)) / BATCHES, 2)
                       for op, n in admin.stats(p)["served"].items()
                       if op.startswith("live_") and n > before.get(op, 0)}
                      for p, before in enumerate(served0)]  # fmt: skip
            syncs = [round((admin.stats(p)["live"]["log_syncs"] - n) / BATCHES, 2)
                     for p, n in enumerate(syncs0)]  # fmt: skip
            # index entries the delta wrote (fresh runs and merges) per batch
            work1 = [index_work(s.address, d) for s in stores]
            work = [round((b[0] - a[0]) / BATCHES) for a, b in zip(work0, work1, strict=True)]
            syncs_all = [round((b[1] - a[1]) / BATCHES, 2) for a, b in zip(work0, work1, strict=True)]
            log_kb = [round((b[2] - a[2]) / BATCHES / 1024, 1) for a, b in zip(work0, work1)]
            compaction = compacted(stores, d) if os.environ.get("COMPACT") else None
            admin.close()
            if WINDOW:
                w.close()
        print(json.dumps({
            "batches": BATCHES, "batch": BATCH, "window": WINDOW, "wall_s": round(wall, 3),
            "edges_per_s_per_part": round(BATCHES * BATCH / wall / 2),
            "writer_cpu_ms_per_batch": round(1000 * wcpu / BATCHES, 2),
            "rate": RATE,
            "main_thread_ms_per_batch": round(1000 * inbatch[0] / BATCHES, 3),
            "writer_threads_ms_user_sys_faults_switches_queued": per_batch(me0, me1),
            "server_cpu_ms_per_batch": [round(1000 * (b - a) / BATCHES, 2)
                                        for a, b in zip(s0, s1, strict=True)],
            # a server takes its half of each batch; the writer, the whole batch
            "server_edges_per_cpu_s": [round(BATCHES * BATCH / 2 / (b - a))
                                       for a, b in zip(s0, s1, strict=True)],
            "writer_edges_per_cpu_s": round(BATCHES * BATCH / wcpu),
            "load_avg": os.getloadavg(),
            "box_cores": box_cores(box0, box1, wall),
            **others(all0, all1, {os.getpid(), *(s.proc.pid for s in stores)}),
            "requests_per_batch": served,
            "log_syncs_per_batch": syncs,
            "index_work_per_batch": work,
            "log_syncs_per_batch_every_server": syncs_all,
            "log_kb_per_batch_every_server": log_kb,
            "request_kb_per_batch": {op: [round(n / BATCHES, 2), round(b / BATCHES / 1024, 1)]
                                     for op, (n, b) in requests.items()},
            "threads_ms_user_sys_faults_switches_queued": [per_batch(a, b) for a, b in zip(t_0, t_1, strict=True)],
            **({"compaction": compaction} if compaction else {}),
            **idle,
        }))  # fmt: skip
        if prof is not None:
            pstats.Stats(prof).sort_stats(os.environ.get("SORT", "cumtime")).print_stats(40)
    finally:
        for spy in spies:
            spy.send_signal(2)
            spy.wait(30)
        for s in stores:
            s.stop()
        if net is not None:
            net.close()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
