"""The synthetic profiles shipped in ``profiles/*.json`` and how they were made.

Means per mini-batch and trainer (GraphSAGE, 3 layers, fanouts 15-10-5, METIS
partitions, one GPU per trainer), with log-normal spread (sigma 0.15):

``products`` (ogbn-products-like: 2.4 M nodes, 100 float32 features, batch 1024)
    sampling 30 ms, GPU compute 12 ms, ~150 k input nodes of which ~65 % are in the
    trainer's own partition: 40 MB own features, 12 MB from each other partition;
    5 MB own / 1 MB other structure; 8 MB batch; 1.6 MB gradients.
``papers100m`` (ogbn-papers100M-like: 111 M nodes, 128 float32 features, batch 1024)
    sampling 60 ms, compute 25 ms, ~300 k input nodes with weaker locality: 60 MB own
    and 30 MB per other partition; 10 MB own / 4 MB other structure; 16 MB batch;
    4 MB gradients.

Regenerate with ``python -m graphrun.placement.synthetic`` (deterministic).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphrun.placement.profile import Empirical, Profile, save_profile

MB = 1e6
MEANS = {
    "products": {
        "sample_s": 0.030,
        "fetch_s": 0.010,
        "compute_s": 0.012,
        "ps_update_s": 0.001,
        "structure_own": 5 * MB,
        "structure_other": 1 * MB,
        "feature_own": 40 * MB,
        "feature_other": 12 * MB,
        "batch_bytes": 8 * MB,
        "grad_bytes": 1.6 * MB,
    },
    "papers100m": {
        "sample_s": 0.060,
        "fetch_s": 0.030,
        "compute_s": 0.025,
        "ps_update_s": 0.002,
        "structure_own": 10 * MB,
        "structure_other": 4 * MB,
        "feature_own": 60 * MB,
        "feature_other": 30 * MB,
        "batch_bytes": 16 * MB,
        "grad_bytes": 4 * MB,
    },
}


def synthetic_profile(name: str, samples: int = 128, seed: int = 0) -> Profile:
    rng = np.random.default_rng(seed)
    qs = {}
    for q, mean in MEANS[name].items():
        sigma = 0.0 if q == "grad_bytes" else 0.15
        x = mean * rng.lognormal(-(sigma**2) / 2, sigma, size=samples)
        qs[q] = Empirical.of(np.round(x, 6) if q.endswith("_s") else np.round(x))
    return Profile(name=name, quantities=qs)


if __name__ == "__main__":
    for name in MEANS:
        path = Path(__file__).parent / "profiles" / f"{name}.json"
        save_profile(synthetic_profile(name), path)
        print(path)
