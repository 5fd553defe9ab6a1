"""CPU time of a sampler call on a live partition (issue 42, an epoch while ingesting):
the seeds' in-edges read through a delta of new edges against the same graph with its
delta folded into the base (what a compaction leaves), one thread, in-process.

    python benchmarks/live_sample_cpu.py      # NODES=200000 DEGREE=40 EDGES=1000000
    THREAD=1 RATE=150 ...                     # the store's delta: its merging thread's
                                              # runs, pieces paced at RATE a second
    WEIGHTED=1 ...                            # weighted sampling (edge feature ``w``)

A power-law graph (``community``) as one CSC; ``EDGES`` new edges between random nodes
committed in pieces of 5,000 (a 10k-edge batch's half on one of two partitions) to a
:class:`~graphrun.store.live.LiveDelta`; then GraphSAGE's two hops (fanouts 10, 5) from
1,024 random seeds, 20 times: ``sample_one_hop`` on the base CSC alone (the delta
compacted: the folded CSC has as many edges), and through the delta
(:func:`graphrun.sampling.live.merged_csc`, what ``sample_neighbors`` does at a version
with a delta). Prints JSON: CPU ms per call of each hop (``time.thread_time``).
``WEIGHTED=1``: every edge has a weight (the new ones in their pieces' rows) and both
sample in proportion to it (``compacted``: the base CSC with its weights; ``delta``:
:class:`graphrun.sampling.live.EdgeWeights`); no ``merged``, which ``delta`` is then.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

NODES = int(os.environ.get("NODES", "200000"))
DEGREE = float(os.environ.get("DEGREE", "40"))
EDGES = int(os.environ.get("EDGES", "1000000"))
PIECE = 5000
WEIGHTED = os.environ.get("WEIGHTED", "0") == "1"
W_KEY = "edge/_N:_E:_N/w"
REPEAT = 20
THREAD = os.environ.get("THREAD", "0") == "1"
RATE = float(os.environ.get("RATE", "150"))  # pieces a second, with THREAD
PROF = None
if os.environ.get("PROFILE"):
    import cProfile

    PROF = cProfile.Profile(time.thread_time)


def main() -> None:
    from graphrun.graph import GenParams, community
    from graphrun.partition.book import PartitionBook
    from graphrun.sampling.csc import CSCGraph
    from graphrun.sampling.live import EdgeWeights, merged_csc, sample_one_hop
    from graphrun.store.live import LiveDelta
    from graphrun.store.live_index import Batch

    g = community(GenParams(nodes=NODES, avg_degree=DEGREE, exponent=2.1, feat_dim=4, classes=5))
    indptr, indices, eids = g.csc()
    rng = np.random.default_rng(0)
    base_w = rng.random(g.num_edges)
    csc = CSCGraph(indptr, indices, eids, weights=base_w[eids] if WEIGHTED else None)
    n, e = g.num_nodes, g.num_edges
    book = PartitionBook.from_config({
        "num_parts": 1, "node_types": ["_N"], "edge_types": [["_N", "_E", "_N"]],
        "node_offsets": [0, n], "edge_offsets": [0, e], "node_ranges": {"_N": [0, n]},
        "edge_ranges": {"_N:_E:_N": [0, e]},
    })  # fmt: skip
    weights = EdgeWeights("w", book, 0, lambda key, rows: base_w[rows]) if WEIGHTED else None
    delta = LiveDelta(background=THREAD)
    delta.warm(wait=True)
    t0 = time.perf_counter()
    e0, empty = g.num_edges, np.empty(0, np.int64)
    for v, lo in enumerate(range(0, EDGES, PIECE), start=1):
        m = min(PIECE, EDGES - lo)
        edges = np.vstack([rng.integers(0, NODES, m), rng.integers(0, NODES, m),
                           e0 + lo + np.arange(m)])  # fmt: skip
        rows = {W_KEY: (edges[2], rng.random(m))} if WEIGHTED else {}
        batch = Batch(v, empty, np.empty(0, np.int32), empty, edges, np.zeros(m, np.int32),
                      empty, rows, {})  # fmt: skip
        if THREAD:
            time.sleep(max(0.0, t0 + v / RATE - time.perf_counter()))
        delta.hold(batch, 0.0)
        delta.commit(v)
    head = v
    if THREAD:  # the thread's merges done: the runs a read finds
        time.sleep(1.0)
    _ = delta.runs
    out: dict[str, object] = {"nodes": NODES, "base_edges": g.num_edges, "delta_edges": EDGES,
                              "runs": len(delta.runs)}  # fmt: skip
    for name in ("compacted", "delta") if WEIGHTED else ("compacted", "merged", "delta"):
        hops = [0.0, 0.0]
        for i in range(REPEAT):
            seeds = rng.integers(0, NODES, 1024)
            for h, k in enumerate((10, 5)):
                t = time.thread_time()
                if name == "delta":
                    if PROF is not None:
                        PROF.enable()
                    got = sample_one_hop(csc, delta, head, seeds, [k], replace=False, seed=i,
                                         weights=weights)  # fmt: skip
                    if PROF is not None:
                        PROF.disable()
                elif name == "merged":  # before: the seeds' whole in-edges merged first
                    g_ = merged_csc(csc, delta, head, seeds)
                    got = g_.sample_one_hop(np.arange(len(seeds)), [k], seed=i)
                else:
                    got = csc.sample_one_hop(seeds, [k], weighted=WEIGHTED, seed=i)
                hops[h] += time.thread_time() - t
                seeds = np.unique(got.src)
        out[f"{name}_ms_per_call"] = [round(1000 * x / REPEAT, 2) for x in hops]
    out["load_avg"] = os.getloadavg()
    print(json.dumps(out))
    delta.close()
    if PROF is not None:
        import pstats

        pstats.Stats(PROF).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
