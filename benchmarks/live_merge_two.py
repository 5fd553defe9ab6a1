"""The delta's compiled merge of two runs (``live_kernels.merge_two``) alone: CPU ns an
entry (``time.thread_time``) for C-ordered runs of 5 rows (a merged run's layout), keys
of random destinations among 100k rows, sizes as the merge rule pairs them, and one
Fortran-ordered pair (a run sorted by numpy). Run old and new code in turns
(``PYTHONPATH``); issue 42, merge63.

    python benchmarks/live_merge_two.py          # REPS=3

Prints JSON: per ``older+newer[/F]`` pair, the ns an entry of each repetition.
"""

import json
import os
import time

import numpy as np

from graphrun.store.live_kernels import merge_two, warm_up

PAIRS = [(10_000, 5_000, "C"), (40_000, 20_000, "C"), (400_000, 200_000, "C"),
         (400_000, 20_000, "C"), (40_000, 20_000, "F")]  # fmt: skip


def run(rng: np.random.Generator, n: int, version: int) -> np.ndarray:
    dst = np.sort(rng.integers(0, 100_000, n))
    src = rng.integers(0, 1 << 30, n)
    return np.vstack([src, dst, np.arange(n), np.zeros(n, np.int64), np.full(n, version)])


def main() -> None:
    warm_up()
    rng = np.random.default_rng(0)
    out: dict[str, list[float]] = {}
    for _ in range(int(os.environ.get("REPS", "3"))):
        for na, nb, order in PAIRS:
            a, b = np.asarray(run(rng, na, 1), order=order), run(rng, nb, 2)
            dst = np.empty((5, na + nb), np.int64)
            reps = max(1, 3_000_000 // na)
            t = time.thread_time()
            for _ in range(reps):
                merge_two(a, b, 1, dst)
            ns = (time.thread_time() - t) / reps / (na + nb) * 1e9
            name = f"{na}+{nb}" + ("/F" if order == "F" else "")
            out.setdefault(name, []).append(round(ns, 2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
