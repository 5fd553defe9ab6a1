"""Which device a trainer computes on, and what follows from it.

A job with ``runtime.gpusPerMachine: G`` runs one trainer per GPU by default; the
``i``-th trainer of a machine (its local rank) is pinned to ``cuda:(i % G)`` — an index
into the GPUs the machine shows the worker (all of the host's, or those the Kubernetes
device plugin gave the pod, or a ``CUDA_VISIBLE_DEVICES`` the worker was started with).
The launcher passes it as the trainer's ``--gpu``. Everything here but
:func:`cuda_count` and the OOM guard is a pure function of its arguments (tested on CPU).

* backend: NCCL between GPU trainers, gloo between CPU ones (:func:`backend_for`);
* precision: ``auto`` is bf16 on a GPU that supports it (compute capability 8.0 and
  up), else the CPU rule of :func:`graphrun.train.models.resolve_precision`;
* :func:`check_gpus`: a job that asks for more GPUs than the machine has fails up front
  with one line naming the machine and what it has;
* :func:`oom_guard`: a CUDA out-of-memory becomes one line naming the role, the batch
  and the setting to lower;
* :class:`IdleMeter`: the share of an epoch the GPU waited for its next batch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from graphrun.errors import ArgumentError, UserError
from graphrun.names import RoleName

DEVICES = ("auto", "cpu", "cuda")


def local_rank(rank: int, trainers_per_machine: int) -> int:
    """Trainer ``rank``'s index among its machine's trainers (co-located ranks are
    consecutive: trainer ``r`` runs on machine ``r // trainers_per_machine``)."""
    if trainers_per_machine < 1:
        raise ArgumentError(f"trainersPerMachine: expected >= 1, got {trainers_per_machine}")
    return rank % trainers_per_machine


def gpu_index(local: int, gpus_per_machine: int) -> int | None:
    """The machine's GPU trainer ``local`` is pinned to, or None with no GPUs."""
    if gpus_per_machine <= 0:
        return None
    return local % gpus_per_machine


def resolve_device(asked: str, gpus_per_machine: int, cuda_available: bool) -> str:
    """``"cuda"`` or ``"cpu"``: ``asked`` is ``cpu``, ``cuda`` or ``auto`` (CUDA when the
    job gives the machine GPUs and CUDA sees one)."""
    if asked not in DEVICES:
        raise ArgumentError(f"device: {asked!r} is not one of {', '.join(DEVICES)}")
    if asked == "auto":
        return "cuda" if gpus_per_machine > 0 and cuda_available else "cpu"
    return asked


def backend_for(device: str) -> str:
    """The ``torch.distributed`` backend between trainers on ``device``."""
    return "nccl" if device.startswith("cuda") else "gloo"


def precision_for(precision: str, device: str, bf16_supported: bool, cpu_native: bool) -> str:
    """``training.precision`` on ``device``: ``auto`` is bf16 (autocast) on a GPU that
    supports it, on a CPU where it has a native bf16 product; fp32 otherwise."""
    if precision not in ("auto", "fp32", "bf16"):
        raise ArgumentError(f"precision: {precision!r} is not 'auto', 'fp32' or 'bf16'")
    if precision != "auto":
        return precision
    native = bf16_supported if device.startswith("cuda") else cpu_native
    return "bf16" if native else "fp32"


def cuda_count() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(
    machine: str, asked: int, have: int, names: list[str] | None = None,
    field: str = "runtime.gpusPerMachine",
) -> None:  # fmt: skip
    """Fail up front, in one line naming the machine, what it has and the job's ``field``
    that asks (``runtime.gpus`` where the user wrote that), when a job asks for more GPUs
    per machine than CUDA sees there."""
    if asked <= have:
        return
    what = f"{have} CUDA device(s)" + (f" ({', '.join(names)})" if names else "")
    raise UserError(f"machine {machine or '?'}: has {what}; the job asks for {asked} ({field})")


def oom_message(role: RoleName, batch_size: int, setting: str, detail: str = "") -> str:
    first = detail.strip().splitlines()[0] if detail.strip() else ""
    return (
        f"{role}: CUDA out of memory at batch size {batch_size}"
        + (f" ({first})" if first else "")
        + f"; lower {setting}"
    )


@contextlib.contextmanager
def oom_guard(
    role: RoleName, batch_size: int, setting: str = "training.batchSize"
) -> Iterator[None]:
    """Turn a CUDA out-of-memory inside the block into one :class:`UserError` line."""
    import torch

    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        raise UserError(oom_message(role, batch_size, setting, str(exc))) from None


@dataclass
class IdleMeter:
    """The share of an epoch the device waited for its next batch.

    ``wait()`` brackets the time the trainer blocks on the feed for the batch the step
    needs (the GPU has nothing queued then); ``share`` is that over the epoch's wall time.
    With ``clock`` injectable it is a pure accounting object."""

    clock: Callable[[], float] = time.perf_counter
    waited_s: float = 0.0
    started: float | None = None
    steps: int = 0

    def start(self) -> None:
        self.waited_s, self.steps = 0.0, 0
        self.started = self._now()

    def _now(self) -> float:
        return float(self.clock())

    @contextlib.contextmanager
    def wait(self) -> Iterator[None]:
        t0 = self._now()
        try:
            yield
        finally:
            self.waited_s += self._now() - t0
            self.steps += 1

    def share(self) -> float:
        if self.started is None:
            return 0.0
        wall = self._now() - self.started
        return min(1.0, self.waited_s / wall) if wall > 0 else 0.0
