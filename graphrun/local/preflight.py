"""What a job's trainers will need, checked before any of them starts.

A trainer that finds a missing feature, a label of -1 among its training nodes or an
entry point that does not import fails minutes into a job, once per restart. These
checks run in the launcher instead — on the spec alone (entry point, script, checkpoint
directory) before anything starts, and on the partition directory (feature and label
names, masks, label ranges) as soon as it exists — and raise one :class:`SpecError`
naming the job file, the field and what is wrong.

Only what the partition metadata and the per-part arrays (memory-mapped, never read
whole into memory at once beyond one column of one part) can tell is checked here;
the trainers keep their own checks.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from graphrun.errors import SpecError
from graphrun.graph.graph import MASKS
from graphrun.job.spec import GraphJob
from graphrun.machine.roles import JobPaths
from graphrun.names import TensorKey
from graphrun.partition.format import load_partition_config


def check_before_start(job: GraphJob, paths: JobPaths) -> None:
    """Spec-only checks: the user's code can be found, checkpoints can be written."""
    t = job.spec.training
    where = f"{paths.job_file}: spec.training"
    if t.script is not None and not (paths.base_dir / t.script).is_file():
        raise SpecError(f"{where}.script: {paths.base_dir / t.script} does not exist")
    if t.entry_point is not None:
        _check_entry_point(t.entry_point, paths.base_dir, f"{where}.entryPoint")
    _check_writable(paths.checkpoints, f"{where}.checkpointDir")


def check_checkpoint(paths: JobPaths) -> None:
    """``--resume``: the checkpoint the trainers will load, checked whole now (one line
    naming its field) rather than by every trainer once the stores are up."""
    from graphrun.train.checkpoint import FILE, load_checkpoint

    if (paths.checkpoints / FILE).is_file():
        load_checkpoint(paths.checkpoints)


def check_gpus_here(job: GraphJob, count: int | None = None) -> None:
    """The local backend's machines run on this host: each needs the job's
    ``runtime.gpusPerMachine`` (or ``gpus``) of the GPUs CUDA sees here (``count``; asked of
    torch when None, only for GPU jobs). One line naming the machine, what it has and the
    field the user wrote."""
    gpus = job.spec.runtime.machine_gpus
    if gpus <= 0:
        return
    if count is None:
        from graphrun.train.device import cuda_count

        count = cuda_count()
    from graphrun.train.device import check_gpus

    check_gpus(
        f"{job.spec.machine_names[0]} (this host)", gpus, count, field=job.spec.runtime.gpus_field
    )


def _check_entry_point(spec: str, base_dir: Path, field: str) -> None:
    """The module of ``module:function`` can be found (beside the job file or installed)."""
    module = spec.partition(":")[0]
    sys.path.insert(0, str(base_dir))  # as the trainer does (graphrun.machine.trainer)
    missing = f"{field}: no module {module!r} beside the job file ({base_dir}) or installed"
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        raise SpecError(missing) from None
    except (ImportError, ValueError) as exc:  # its package's __init__ failed to import
        raise SpecError(f"{field}: cannot import module {module!r} ({exc})") from None
    finally:
        sys.path.remove(str(base_dir))
    if found is None:
        raise SpecError(missing)


def _check_writable(directory: Path, field: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise SpecError(f"{field}: {directory} is not writable ({exc.strerror})") from None


def check_store(job: GraphJob, paths: JobPaths, timeout_s: float = 10.0) -> None:
    """A job on a running store (``graph.store``): its key opens it, it serves exactly the
    partitions named, and it has the feature and label columns the built-in task reads."""
    from graphrun.errors import GraphrunError
    from graphrun.machine.roles import store_key_file
    from graphrun.rpc.auth import load_keys
    from graphrun.store.client import ClientConfig, KVClient

    ref = job.spec.graph.store
    key_file = store_key_file(job, paths)
    assert ref is not None and key_file is not None
    where = f"{paths.job_file}: spec.graph.store"
    keys = load_keys(key_file)
    cfg = ClientConfig(
        list(ref.addresses), job=job.name, keys=keys, timeout=timeout_s,
        heartbeat_interval=0, name="graphrun-run-check",
    )  # fmt: skip
    try:
        client = KVClient(cfg)
    except GraphrunError as exc:
        raise SpecError(f"{where}.addresses: cannot join the store ({exc})") from None
    with client:
        stored = {TensorKey.parse(t.name) for t in client.list_tensors()}
    t = job.spec.training
    if t.task is None or t.task == "link-prediction":
        return
    ntype = t.target_node_type or "_N"
    needed = [("feature", t.feature), ("label", t.label)]
    for field, column in needed:
        key = TensorKey.node(ntype, column)
        if key not in stored:
            raise SpecError(f"{where}: the store has no {field} {key} (spec.training.{field})")


def check_partitions(job: GraphJob, paths: JobPaths) -> None:
    """The partition directory has what the job's built-in task reads."""
    t = job.spec.training
    if t.task is None:  # the user's code decides what it reads
        return
    meta = load_partition_config(paths.parts)
    where = f"{paths.job_file}: spec.training"
    ntypes: list[str] = list(meta.get("node_types", []))
    ntype = t.target_node_type or (ntypes[0] if ntypes else "_N")
    if ntype not in ntypes:
        raise SpecError(f"{where}.targetNodeType: {ntype!r} is not a node type of the graph "
                        f"(it has {', '.join(ntypes)})")  # fmt: skip
    columns: dict[str, Any] = meta.get("node_features", {}).get(ntype, {})
    if t.task == "link-prediction":
        return  # features are optional and edges carry the labels
    if t.task == "node-classification" and t.feature not in columns:
        raise SpecError(f"{where}.feature: node type {ntype!r} has no feature {t.feature!r} "
                        f"(it has {', '.join(sorted(columns)) or 'none'})")  # fmt: skip
    if t.label not in columns:
        raise SpecError(f"{where}.label: node type {ntype!r} has no column {t.label!r} "
                        f"(it has {', '.join(sorted(columns)) or 'none'})")  # fmt: skip
    for mask in MASKS:
        if mask not in columns:
            raise SpecError(
                f"{paths.parts}: node type {ntype!r} has no {mask!r}: the dataset needs "
                "train/val/test splits for the job's task"
            )
    for part in meta.get("parts", []):
        _check_labels(paths.parts / part["dir"] / "node" / ntype, t.label, f"{where}.label")


def _check_labels(node_dir: Path, label: str, field: str) -> None:
    """Every training, validation and test node of one part has a label >= 0."""
    y = np.load(node_dir / f"{label}.npy", mmap_mode="r")
    if not np.issubdtype(y.dtype, np.integer):
        raise SpecError(f"{field}: {node_dir / label}.npy holds {y.dtype}, not integer classes")
    for mask in MASKS:
        m = np.load(node_dir / f"{mask}.npy", mmap_mode="r")
        bad = np.flatnonzero(np.asarray(m) & (np.asarray(y) < 0))
        if bad.size:
            raise SpecError(
                f"{field}: {bad.size} nodes of {mask} in {node_dir} have a negative label "
                f"(first: local row {int(bad[0])}, label {int(y[bad[0]])})"
            )
