"""GPUs in a GraphJob: machines × GPUs per machine, and one trainer per GPU.

``runtime.gpusPerMachine: G`` gives each machine ``G`` GPUs and, unless
``trainersPerMachine`` is given, ``G`` trainers (one per GPU). ``runtime.gpus: N`` is a
total: with ``gpusPerMachine`` it sets ``machines = N / G``; with ``machines`` it sets
``G = N / machines``; alone, the Kubernetes operator splits it as the MPI Operator
proposal does (:func:`split_gpus`: fewer than a node's GPUs on one machine, else whole
nodes), and the local backend puts all ``N`` on its machines (one by default). A GPU
job's trainers get :data:`GPU_SAMPLER_WORKERS` sampler workers each unless
``samplerWorkersPerTrainer`` is given.
Pure functions of their arguments.
"""

from __future__ import annotations

from typing import Any

from graphrun.errors import SpecError

#: Sampler worker processes per GPU trainer unless the spec says: sampling stays on CPU
#: processes, and one sampling in the trainer cannot keep a GPU busy.
GPU_SAMPLER_WORKERS = 4


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def gpu_defaults(data: object) -> object:
    """The raw ``runtime`` mapping with what ``gpus``/``gpusPerMachine`` imply filled in
    (``machines``, ``trainersPerMachine``); ValueError for totals that do not divide."""
    if not isinstance(data, dict):
        return data

    def given(camel: str, snake: str) -> int | None:
        return _int(data[camel]) if camel in data else _int(data.get(snake))

    per, total = given("gpusPerMachine", "gpus_per_machine"), _int(data.get("gpus"))
    machines = _int(data.get("machines"))
    out = dict(data)
    if total is not None and per:
        if total % per:
            raise ValueError(f"gpus: {total} is not a multiple of gpusPerMachine ({per})")
        if machines is not None and machines != total // per:
            raise ValueError(
                f"gpus: {total} GPUs at gpusPerMachine {per} make {total // per} machines, "
                f"not machines ({machines})"
            )
        out["machines"] = total // per
    elif total is not None and per is None:
        m = machines or 1
        if total % m:
            raise ValueError(f"gpus: {total} does not divide among machines ({m})")
        per = total // m
    if per and "trainersPerMachine" not in data and "trainers_per_machine" not in data:
        out["trainersPerMachine"] = per
    workers = ("samplerWorkersPerTrainer", "sampler_workers_per_trainer")
    if per and not any(k in data for k in workers):
        out["samplerWorkersPerTrainer"] = GPU_SAMPLER_WORKERS
    return out


def split_gpus(total: int, per_node: int) -> tuple[int, int]:
    """``(machines, GPUs per machine)`` for ``total`` GPUs on nodes of ``per_node``: all
    on one machine when they fit a node, else whole nodes (``total`` a multiple)."""
    if total < 1 or per_node < 1:
        raise SpecError(f"gpus: {total} GPUs on nodes of {per_node}: both must be positive")
    if total <= per_node:
        return 1, total
    if total % per_node:
        raise SpecError(
            f"spec.runtime.gpus: {total} is more than a node's {per_node} GPUs and not a "
            f"multiple of it; ask for a multiple or set gpusPerMachine"
        )
    return total // per_node, per_node


def split_document(doc: object, per_node: int) -> object:
    """A GraphJob document (parsed YAML, before validation) whose ``spec.runtime`` gives
    ``gpus`` alone, with ``machines`` and ``gpusPerMachine`` set by :func:`split_gpus`
    (what the operator does, knowing its nodes' GPUs); any other document unchanged."""
    if not isinstance(doc, dict):
        return doc
    runtime = doc.get("spec", {}).get("runtime")
    if not isinstance(runtime, dict) or _int(runtime.get("gpus")) is None:
        return doc
    if set(runtime) & {"machines", "gpusPerMachine", "gpus_per_machine"}:
        return doc
    machines, per = split_gpus(runtime["gpus"], per_node)
    new_runtime = {**runtime, "machines": machines, "gpusPerMachine": per}
    return {**doc, "spec": {**doc["spec"], "runtime": new_runtime}}
