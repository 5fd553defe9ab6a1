"""The merging thread's rule with compiled merges (issue 42, idx42): the binary rule the
thread uses against a 4-way rule, every run sorted by ``live_kernels.sort_columns`` and
merged by ``merge_two`` or a 4-way kernel compiled here (a sketch, not the store's code),
over groups of four 5,000-edge pieces (the grouped thread's fresh runs).

    python benchmarks/live_merge_kway.py      # PIECES=300

Prints JSON per rule (each twice, in turns): CPU ms a piece (``time.thread_time``),
entries written a new edge, the most runs at any time and at the end.
"""

import json
import os
import time

import numba
import numpy as np

from graphrun.store.live_kernels import merge_two, sort_columns, warm_up

warm_up()


@numba.njit(
    "void(int64[:, :], int64[:, :], int64[:, :], int64[:, :], int64, int64[:, :])",
    nogil=True,
    cache=True,
)
def merge_four(a, b, c, d, key, out):
    rows = a.shape[0]
    n0, n1, n2, n3 = a.shape[1], b.shape[1], c.shape[1], d.shape[1]
    i0 = i1 = i2 = i3 = 0
    big = np.int64(1) << 62
    for k in range(n0 + n1 + n2 + n3):
        k0 = a[key, i0] if i0 < n0 else big
        k1 = b[key, i1] if i1 < n1 else big
        k2 = c[key, i2] if i2 < n2 else big
        k3 = d[key, i3] if i3 < n3 else big
        if k0 <= k1 and k0 <= k2 and k0 <= k3:
            for r in range(rows):
                out[r, k] = a[r, i0]
            i0 += 1
        elif k1 <= k2 and k1 <= k3:
            for r in range(rows):
                out[r, k] = b[r, i1]
            i1 += 1
        elif k2 <= k3:
            for r in range(rows):
                out[r, k] = c[r, i2]
            i2 += 1
        else:
            for r in range(rows):
                out[r, k] = d[r, i3]
            i3 += 1


PIECES, PIECE, G = int(os.environ.get("PIECES", "300")), 5000, 4
rng = np.random.default_rng(0)
groups = []
for g in range(PIECES // G):
    a = np.vstack(
        [
            rng.integers(0, 200000, (1, G * PIECE)),
            rng.integers(0, 100000, (1, G * PIECE)),
            np.arange(G * PIECE)[None] + g * G * PIECE,
            np.zeros((1, G * PIECE), np.int64),
            np.full((1, G * PIECE), g),
        ]
    )
    groups.append(np.ascontiguousarray(a))


def merge(runs):
    out = np.empty((5, sum(r.shape[1] for r in runs)), np.int64)
    if len(runs) == 2:
        merge_two(runs[0], runs[1], 1, out)
    else:
        e = np.empty((5, 0), np.int64)
        rr = list(runs) + [e] * (4 - len(runs))
        merge_four(rr[0], rr[1], rr[2], rr[3], 1, out)
    return out


def due2(s):
    for i in range(len(s) - 2, -1, -1):
        if s[i] <= s[i + 1]:
            return i, 2


def due4(s):
    # the last 4 adjacent runs: none larger than the first, nor it 4x the last (as
    # live_merge_rule.py's k-way rule)
    for i in range(len(s) - 4, -1, -1):
        w = s[i : i + 4]
        if all(x <= w[0] for x in w[1:]) and w[0] <= 4 * w[-1]:
            return i, 4
    for i in range(len(s) - 2, -1, -1):  # a smaller run before a larger one (reads' flushes)
        if 4 * s[i] <= s[i + 1]:
            return i, 2


for name, due in (("binary", due2), ("4-way", due4), ("binary", due2), ("4-way", due4)):
    runs, most, written = [], 0, 0
    t = time.thread_time()
    for g in groups:
        out = np.empty_like(g)
        sort_columns(g, 1, out)
        runs.append(out)
        written += out.shape[1]
        while (at := due([r.shape[1] for r in runs])) is not None:
            i, k = at
            m = merge(runs[i : i + k])
            written += m.shape[1]
            runs[i : i + k] = [m]
        most = max(most, len(runs))
    cpu = time.thread_time() - t
    print(
        json.dumps(
            {
                "rule": name,
                "cpu_ms_per_piece": round(1000 * cpu / PIECES, 3),
                "written_per_edge": round(written / PIECES / PIECE, 2),
                "most_runs": most,
                "runs_end": len(runs),
            }
        )
    )
