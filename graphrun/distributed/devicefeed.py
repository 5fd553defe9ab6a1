"""The path of a mini-batch from the sampler to the trainer's device.

Sampling and feature pulls stay on CPU processes; a trainer computing on a GPU gets its
batches through a :class:`Prefetcher`: a thread takes the next batch from the loader
while the current step computes, packs its tensors into a *staging slot* (one reusable
host buffer per slot: page-locked on CUDA, so copies are asynchronous), issues
``non_blocking`` copies on a side stream and records an event; the trainer's stream
waits on that event before the step uses the batch. So the batch is on the GPU before
the step needs it, and the copy overlaps the previous step's compute.

What differs between devices is behind :class:`Transfer`: :class:`CpuTransfer` (host
buffers are plain tensors, a "copy" clones, events are done at once) runs the same
staging, slot reuse and prefetch logic the tests exercise without a GPU;
:class:`CudaTransfer` uses pinned buffers, a side stream and CUDA events.

With a :class:`~graphrun.distributed.gpucache.GpuFeatureCache` the node features of
cached ids never cross PCIe: only the missing rows are packed, and the batch's ``x`` is
assembled on the device from the cache and the copied rows.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import Tensor

from graphrun.distributed.gpucache import GpuFeatureCache
from graphrun.errors import GraphrunError

ALIGN = 256  # bytes: each packed tensor starts at a multiple (copy engines like it aligned)


class Event(Protocol):
    def synchronize(self) -> None: ...


class Transfer(Protocol):
    """Host staging memory, host-to-device copies and their completion events."""

    device: torch.device

    def host_buffer(self, nbytes: int) -> Tensor: ...
    def copy(self, host: Tensor) -> Tensor: ...
    def record(self) -> Event: ...
    def consume(self, event: Event, tensors: list[Tensor]) -> None: ...
    def context(self) -> AbstractContextManager[object]: ...


class _Done:
    def synchronize(self) -> None:
        return None


class CpuTransfer:
    """The CPU implementation: plain host buffers, copies that clone (so a slot can be
    reused at once), events that are always complete."""

    device = torch.device("cpu")

    def host_buffer(self, nbytes: int) -> Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy(self, host: Tensor) -> Tensor:
        return host.clone()

    def record(self) -> Event:
        return _Done()

    def consume(self, event: Event, tensors: list[Tensor]) -> None:
        event.synchronize()

    def context(self) -> AbstractContextManager[object]:
        import contextlib

        return contextlib.nullcontext()


class CudaTransfer:
    """Pinned host buffers, ``non_blocking`` copies on a side stream, CUDA events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def host_buffer(self, nbytes: int) -> Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy(self, host: Tensor) -> Tensor:
        return host.to(self.device, non_blocking=True)

    def record(self) -> Event:
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def consume(self, event: Event, tensors: list[Tensor]) -> None:
        main = torch.cuda.current_stream(self.device)
        assert isinstance(event, torch.cuda.Event)  # this transfer's record() made it
        main.wait_event(event)
        for t in tensors:  # the allocator must not reuse them before the step is done
            t.record_stream(main)

    def context(self) -> AbstractContextManager[object]:
        return torch.cuda.stream(self.stream)


def transfer_for(device: torch.device) -> Transfer:
    return CudaTransfer(device) if device.type == "cuda" else CpuTransfer()


class Slot:
    """One reusable host buffer; tensors are packed into it at aligned offsets."""

    def __init__(self, transfer: Transfer) -> None:
        self.transfer = transfer
        self.buffer: Tensor | None = None
        self.event: Event | None = None  # the last copy out of this buffer
        self.grown = 0  # times the buffer was (re)allocated

    def reserve(self, sizes: list[int]) -> list[int]:
        """Offsets for tensors of ``sizes`` bytes; waits for the slot's last copy and
        grows the buffer (by half again) when they do not fit."""
        offsets, end = [], 0
        for n in sizes:
            offsets.append(end)
            end += -(-n // ALIGN) * ALIGN
        if self.event is not None:
            self.event.synchronize()  # the previous batch's copy has left this buffer
            self.event = None
        if self.buffer is None or self.buffer.numel() < end:
            cap = max(end, int(self.buffer.numel() * 1.5) if self.buffer is not None else 0)
            self.buffer = self.transfer.host_buffer(max(cap, ALIGN))
            self.grown += 1
        return offsets

    def view(self, offset: int, like_shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        assert self.buffer is not None
        n = 1
        for s in like_shape:
            n *= s
        nbytes = n * torch.empty(0, dtype=dtype).element_size()
        return self.buffer[offset : offset + nbytes].view(dtype).view(like_shape)


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class FeedStats:
    """Counters of one epoch (or any span between :meth:`reset` calls)."""

    batches: int = 0
    h2d_bytes: int = 0
    stage_s: float = 0.0  # the feed thread: packing and issuing copies
    wait_s: float = 0.0  # the trainer: blocked waiting for the next batch
    cache_hits: int = 0
    cache_lookups: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        self.batches = self.h2d_bytes = self.cache_hits = self.cache_lookups = 0
        self.stage_s = self.wait_s = 0.0

    @property
    def hit_rate(self) -> float | None:
        return self.cache_hits / self.cache_lookups if self.cache_lookups else None


class DeviceFeed:
    """Moves a batch's tensors to ``transfer.device`` through staging slots.

    ``stage(data)`` (the feed thread) packs every tensor attribute of a PyG ``Data`` or
    ``HeteroData`` into the next slot, copies it and returns ``(data on device,
    event)``; ``ready`` (the trainer) makes its stream wait for that event. With a
    ``cache`` and a homogeneous batch (``n_id``; ``x`` optional: absent when the whole
    table is cached and the loader skipped the features), ``x`` is built on the device.
    """

    def __init__(
        self, transfer: Transfer, slots: int = 4, cache: GpuFeatureCache | None = None
    ) -> None:
        if slots < 2:
            raise GraphrunError(f"DeviceFeed: needs at least 2 slots, got {slots}")
        self.transfer = transfer
        self.slots = [Slot(transfer) for _ in range(slots)]
        self.next_slot = 0
        self.cache = cache
        self.stats = FeedStats()

    def stage(self, data: Any) -> tuple[Any, Event, list[Tensor]]:
        t0 = time.perf_counter()
        slot = self.slots[self.next_slot]
        self.next_slot = (self.next_slot + 1) % len(self.slots)
        items: list[tuple[Any, str, Tensor]] = []
        for store in data.stores if hasattr(data, "stores") else [data]:
            for key, value in list(store.items()):
                if isinstance(value, Tensor) and value.device.type == "cpu":
                    items.append((store, key, value))
        plan = None
        if self.cache is not None and hasattr(data, "n_id") and not hasattr(data, "node_types"):
            plan = self.cache.split(data.n_id)
            self.stats.cache_hits += int(plan.hit_pos.numel())
            self.stats.cache_lookups += int(data.n_id.numel())
            x = getattr(data, "x", None)
            items = [it for it in items if it[1] != "x"]
            items += [(None, "hit_pos", plan.hit_pos), (None, "hit_slot", plan.hit_slot)]
            if plan.miss_pos.numel():
                if x is None:
                    raise GraphrunError(
                        "DeviceFeed: a batch without features has ids the GPU cache lacks"
                    )
                items.append((None, "miss_pos", plan.miss_pos))
                items.append((None, "miss_x", x))  # gathered below, straight into the slot
        sizes = []
        for _, key, t in items:
            if key == "miss_x":
                assert plan is not None
                sizes.append(int(plan.miss_pos.numel()) * _nbytes(t[:1]))
            else:
                sizes.append(_nbytes(t))
        offsets = slot.reserve(sizes)
        moved: dict[str, Tensor] = {}
        out: list[Tensor] = []
        with self.transfer.context():
            for (store, key, t), off in zip(items, offsets, strict=True):
                if key == "miss_x":
                    assert plan is not None
                    shape = (int(plan.miss_pos.numel()), *t.shape[1:])
                    host = slot.view(off, shape, t.dtype)
                    torch.index_select(t, 0, plan.miss_pos, out=host)
                else:
                    host = slot.view(off, tuple(t.shape), t.dtype)
                    host.copy_(t)
                dev = self.transfer.copy(host)
                self.stats.h2d_bytes += _nbytes(host)
                out.append(dev)
                if store is None:
                    moved[key] = dev
                else:
                    store[key] = dev
            if plan is not None and self.cache is not None:
                x_dev = self.cache.assemble(
                    int(data.n_id.numel()), moved["hit_pos"], moved["hit_slot"],
                    moved.get("miss_pos"), moved.get("miss_x"),
                )  # fmt: skip
                data.x = x_dev
                out.append(x_dev)
            event = self.transfer.record()
        slot.event = event
        self.stats.batches += 1
        self.stats.stage_s += time.perf_counter() - t0
        return data, event, out

    def ready(self, event: Event, tensors: list[Tensor]) -> None:
        self.transfer.consume(event, tensors)


class Staged(Protocol):
    """A batch the feed moves: its ``data`` (a PyG ``Data``/``HeteroData``) is staged."""

    data: Any


B = TypeVar("B", bound=Staged)


class Prefetcher(Generic[B]):
    """Iterates ``batches`` (objects with a ``.data``) with up to ``depth`` of them staged
    ahead by a thread; each one it yields has ``.data`` on the device and ready for the
    trainer's stream. Errors of the loader or the feed are raised in the trainer; every
    wait is bounded by ``timeout_s``."""

    _END = object()

    def __init__(
        self, batches: Iterable[B], feed: DeviceFeed, depth: int = 2, timeout_s: float = 600.0
    ) -> None:
        self.feed, self.timeout_s = feed, timeout_s
        self.q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self.source = iter(batches)
        self.thread = threading.Thread(target=self._run, daemon=True, name="device-feed")
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            device = self.feed.transfer.device
            if device.type == "cuda":
                torch.cuda.set_device(device)
            for batch in self.source:
                if self.stop.is_set():
                    return
                data, event, tensors = self.feed.stage(batch.data)
                batch.data = data
                if not self._put((batch, event, tensors)):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the trainer
            self._put(exc)

    def __iter__(self) -> Iterator[B]:
        return self

    def __next__(self) -> B:
        t0 = time.perf_counter()
        deadline = t0 + self.timeout_s
        while True:
            try:
                item = self.q.get(timeout=min(1.0, max(0.01, deadline - time.perf_counter())))
                break
            except queue.Empty:
                if not self.thread.is_alive() and self.q.empty():
                    raise GraphrunError("device feed: its thread ended without a batch") from None
                if time.perf_counter() > deadline:
                    raise GraphrunError(
                        f"device feed: no batch within {self.timeout_s:g} s"
                    ) from None
        self.feed.stats.wait_s += time.perf_counter() - t0
        if item is self._END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        batch, event, tensors = item
        self.feed.ready(event, tensors)
        return batch

    def close(self) -> None:
        self.stop.set()
        while True:  # unblock a thread waiting to put
            try:
                self.q.get_nowait()
            except queue.Empty:
                break
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=60.0)
