"""Thread CPU of the four servers' apply path a paced batch with ``replicas: 2``, without
RPC (issue 42, apply63): partition 0's sequencer (p0), partition 1 (p1) and a replica
of each (r0, r1) as four states in one process, each with its write-ahead log, served
through the store's own handler and loop turn (``make_handler``, ``Turn.end``: the sync
and the answers). A batch is what a paced ``commit()`` sends: ``live_begin`` with
partition 0's piece at p0 and r0 (the replica's through ``replicate``, as forwarded),
``live_prepare`` at p1 and r1, ``live_decide`` at p0 and r0, ``live_commit`` at p1 and
r1; ``BATCH`` new edges between random base nodes of the 200k graph's 2-part split.
Not counted: decoding, the guard, replies on the wire, the forwards' sends, the delta's
merging thread (``benchmarks/live_ingest_cpu.py`` counts all of them).

    cd /tmp && PYTHONPATH=<code tree> python <tree>/benchmarks/live_apply_cpu.py
    N=300 BATCH=10000 PARTS=/work/data/pl200k-parts ...   # the defaults
    PROF=1 SORT=tottime ...                               # cProfile (thread CPU)

Prints each server's thread CPU in microseconds a batch (``time.thread_time`` around each
request and its turn's end; 20 warm-up batches not counted).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from graphrun.rpc.codec import Message, MsgKind
from graphrun.rpc.tuning import keep_large_allocations, small_pages_for_arrays
from graphrun.store import live_ops
from graphrun.store.server import ServerConfig, build_registry, load_main_state, make_handler
from graphrun.store.writes import Turn

PARTS = Path(os.environ.get("PARTS", "/work/data/pl200k-parts"))
N = int(os.environ.get("N", "300"))
BATCH = int(os.environ.get("BATCH", "10000"))
WARM = 20


def server(tmp: Path, part: int, replica: int):
    """A main server's state (a replica's if ``replica``), its handler and loop turn."""
    shm, live = tmp / f"shm-{part}-{replica}", tmp / f"live-{part}-{replica}"
    shm.mkdir()
    live.mkdir()
    state = load_main_state(ServerConfig(PARTS, part, shm_dir=shm))
    state.replica = replica
    live_ops.attach(state, lambda: np.empty(0, np.int64), None, 5.0, live)
    turn = Turn(state)
    return state, make_handler(state, build_registry(), turn=turn), turn


class Bench:
    def __init__(self, tmp: Path) -> None:
        names = {"p0": (0, 0), "p1": (1, 0), "r0": (0, 1), "r1": (1, 1)}
        self.servers = {k: server(tmp, p, r) for k, (p, r) in names.items()}
        self.cpu = dict.fromkeys(self.servers, 0.0)
        self.book = self.servers["p0"][0].book
        self.rng = np.random.default_rng(0)
        self.rid = 0

    def call(self, name: str, op: str, body: dict, tensors: list[np.ndarray] | None = None):
        """``op`` at server ``name`` (a replica's forwarded), its turn ended; its answer."""
        _, handle, turn = self.servers[name]
        self.rid += 1
        if name.startswith("r"):
            body = {"op": op, "job": "", "s": "", "session": "", "admin": True, "body": body}
            op = "replicate"
        out = []
        t = time.thread_time()
        answer = handle(
            b"writer", Message(MsgKind.REQUEST, op, self.rid, body, tuple(tensors or ()))
        )
        out += [answer] if answer is not None else []
        turn.end(lambda peer, m: out.append(m))
        self.cpu[name] += time.thread_time() - t
        assert out and out[0].kind == MsgKind.REPLY, out and out[0].body
        return out[0].body

    def batch(self) -> None:
        n, off = self.book.num_nodes, self.book.node_offsets
        src, dst = self.rng.integers(0, n, BATCH), self.rng.integers(0, n, BATCH)
        mine = np.searchsorted(off, dst, side="right") - 1 == 0
        m0, m1 = int(mine.sum()), int((~mine).sum())
        ends = np.ascontiguousarray(np.vstack([src[mine], dst[mine]]))
        begin = {"nodes": [0, 0], "edges": [m0, m1],
                 "piece": {"version": 0, "new_edges": 1, "edge_types": 2}}  # fmt: skip
        for name in ("p0", "r0"):
            tensors = [np.empty(0, np.int64), ends.copy(), np.zeros(m0, np.int32)]
            begun = self.call(name, "live_begin", begin, tensors)
        v = begun["version"]
        eids = np.concatenate([np.arange(s, s + c) for s, c in begun["edges"][1]])
        piece = np.ascontiguousarray(np.vstack([src[~mine], dst[~mine], eids]))
        prepare = {"piece": {"version": v, "new_edges": 0, "edge_types": 1},
                   "seq": "tcp://127.0.0.1:1"}  # fmt: skip
        for name in ("p1", "r1"):
            self.call(name, "live_prepare", prepare, [piece.copy(), np.zeros(m1, np.int32)])
        for name in ("p0", "r0"):
            self.call(name, "live_decide", {"version": v, "commit": True})
        for name in ("p1", "r1"):
            self.call(name, "live_commit", {"version": v, "commit": True})

    def close(self) -> None:
        for state, _, _ in self.servers.values():
            live_ops.close(state)
            state.close()


def main() -> None:
    keep_large_allocations()  # as graphrun serve does
    small_pages_for_arrays()
    tmp = Path(tempfile.mkdtemp(prefix="live-apply-"))
    bench = Bench(tmp)
    try:
        for _ in range(WARM):
            bench.batch()
        bench.cpu = dict.fromkeys(bench.cpu, 0.0)
        prof = cProfile.Profile(time.thread_time) if os.environ.get("PROF") else None
        if prof is not None:
            prof.enable()
        for _ in range(N):
            bench.batch()
        if prof is not None:
            prof.disable()
            pstats.Stats(prof).sort_stats(os.environ.get("SORT", "tottime")).print_stats(35)
        per = {k: round(v / N * 1e6) for k, v in bench.cpu.items()}
        print({**per, "total_us_a_batch": sum(per.values()), "load": os.getloadavg()[0]})
    finally:
        bench.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
