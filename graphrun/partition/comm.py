"""Collectives of one rank, over an initialised ``torch.distributed`` process group (gloo).

The distributed partitioner moves numpy arrays only; :class:`Comm` turns them into
torch CPU tensors without copying where it can and uses the process group's own
collectives (``all_to_all_single``, ``all_reduce``, ``all_gather``, ``broadcast``). No
pickle: arrays travel as raw bytes, and every rank knows the dtype and the trailing
shape of what it receives. Every call waits at most the process group's timeout; a
peer that died surfaces as a :class:`PeerLost` naming this rank and the collective.

The large exchanges (edges, asks, feature rows) run in rounds of ``round_bytes`` a
rank sends (:meth:`Comm.send_rows`): a round sorts one slice of rows by destination
and sends that array itself, and the receiver puts what arrives where it belongs, so
neither side ever holds all the rows in flight. The result is what one exchange of
everything gives, row for row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from graphrun.errors import PeerLost
from graphrun.graph.graph import release
from graphrun.names import owners
from graphrun.partition.arrays import ROUND_BYTES, by_rank, rank_order


def _tensor(arr: np.ndarray) -> torch.Tensor:
    """The bytes of ``arr`` as a uint8 tensor (a copy only if ``arr`` is read-only)."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    if not flat.flags.writeable:
        flat = flat.copy()
    return torch.from_numpy(flat)


class Comm:
    """This rank's view of the job: ``rank``, ``world`` and array collectives."""

    def __init__(self, group: Any = None, round_bytes: int = ROUND_BYTES) -> None:
        self.group = group
        self.round_bytes = round_bytes
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    def _run(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, group=self.group, **kwargs)
        except (RuntimeError, dist.DistBackendError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PeerLost(f"rank {self.rank}: {what} failed ({first})") from None

    def exchange(self, sends: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Send ``sends[q]`` to rank ``q``; returns what every rank ``q`` sent here.

        Every array of every rank has the same dtype and the same trailing shape.
        """
        if len(sends) != self.world:
            raise ValueError(f"exchange: {len(sends)} arrays for {self.world} ranks")
        payload = torch.cat([_tensor(a) for a in sends]) if self.world > 1 else _tensor(sends[0])
        return self._split(sends[0], *self._all_to_all(payload, [a.nbytes for a in sends]))

    @staticmethod
    def _split(like: np.ndarray, raw: np.ndarray, in_bytes: list[int]) -> list[np.ndarray]:
        """The bytes received from every rank as rows of ``like``'s dtype and trailing
        shape (views of ``raw``)."""
        dtype, trail = like.dtype, like.shape[1:]
        row_bytes = int(np.prod(trail, dtype=np.int64)) * dtype.itemsize
        out, start = [], 0
        for n in in_bytes:
            rows = n // row_bytes if row_bytes else 0
            out.append(raw[start : start + n].view(dtype).reshape(rows, *trail))
            start += n
        return out

    def rounds(self, n: int, step: int) -> int:
        """Rounds every rank runs to send its ``n`` rows ``step`` at a time: the most any
        rank needs, one at least (so empty ranks still meet the others)."""
        most = int(self.allgather(np.array([n], dtype=np.int64)).max())
        return max(1, -(-most // max(step, 1)))

    def step(self, row_bytes: int) -> int:
        """Rows of ``row_bytes`` a rank sends in one round: ``round_bytes`` of them."""
        return max(1, self.round_bytes // max(row_bytes, 1))

    def send_rows(
        self,
        n: int,
        piece: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        sink: Callable[[int, np.ndarray], None],
        row_bytes: int,
    ) -> None:
        """This rank's rows ``0 .. n-1`` to their ranks, in rounds of at most
        ``round_bytes``: ``piece(lo, hi)`` gives rows ``lo .. hi-1`` (``[hi-lo, ...]``,
        one dtype and trailing shape on every rank) and their destinations, and
        ``sink(q, rows)`` takes what rank ``q`` sent here, in ``q``'s row order over the
        rounds. A round holds one slice of rows, sorted by destination, and what
        arrives: no array of all the rows is made on either side."""
        step = self.step(row_bytes)
        for k in range(self.rounds(n, step)):
            lo, hi = min(k * step, n), min((k + 1) * step, n)
            dest, rows = piece(lo, hi)
            like = rows[:0]
            order, cuts = rank_order(dest, self.world)
            rows = np.ascontiguousarray(rows[order])  # the payload itself, sent uncopied
            del dest, order
            width = int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.dtype.itemsize
            raw, in_bytes = self._all_to_all(_tensor(rows), np.diff(cuts) * width)
            del rows
            for q, got in enumerate(self._split(like, raw, in_bytes)):
                sink(q, got)

    def exchange_rows(self, dest: np.ndarray, *cols: np.ndarray) -> np.ndarray:
        """Row ``i`` (entry ``i`` of every column, as ``cols[0]``'s dtype) to rank
        ``dest[i]``; returns every row sent here as one ``[m, len(cols)]`` array, in rank
        order and stable inside a rank: what one all-to-all of the sorted rows gives,
        sent in rounds (:meth:`send_rows`) and placed at its sender's place as it
        arrives. Columns may be memory-mapped: a round reads its slice of them."""
        width, dtype = len(cols), cols[0].dtype
        counts = self.allgather(np.bincount(dest, minlength=self.world))  # [from, to]
        mine = counts[:, self.rank]
        out = np.empty((int(mine.sum()), width), dtype=dtype)
        at = np.cumsum(mine) - mine

        def piece(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
            rows = np.empty((hi - lo, width), dtype=dtype)
            for j, col in enumerate(cols):
                rows[:, j] = col[lo:hi]
                release(col)
            return np.asarray(dest[lo:hi]), rows

        def sink(q: int, got: np.ndarray) -> None:
            out[at[q] : at[q] + len(got)] = got
            at[q] += len(got)

        self.send_rows(len(dest), piece, sink, width * dtype.itemsize)
        return out

    def _all_to_all(self, payload: torch.Tensor, out_bytes: Any) -> tuple[np.ndarray, list[int]]:
        """``payload`` holds ``out_bytes[q]`` bytes for every rank ``q``, in rank order;
        returns the bytes received (in rank order) and how many came from each rank."""
        sizes = torch.tensor([int(n) for n in out_bytes], dtype=torch.int64)
        in_bytes = torch.empty(self.world, dtype=torch.int64)
        self._run("exchange (sizes)", dist.all_to_all_single, in_bytes, sizes)
        received = torch.empty(int(in_bytes.sum()), dtype=torch.uint8)
        self._run(
            "exchange",
            dist.all_to_all_single,
            received,
            payload,
            output_split_sizes=in_bytes.tolist(),
            input_split_sizes=sizes.tolist(),
        )
        return received.numpy(), in_bytes.tolist()

    def allreduce_sum(self, arr: np.ndarray) -> np.ndarray:
        """Element-wise sum over ranks (int64 or float64)."""
        t = torch.from_numpy(np.array(arr, copy=True))
        self._run("all_reduce", dist.all_reduce, t)
        return t.numpy()

    def allgather(self, arr: np.ndarray) -> np.ndarray:
        """``[world, *arr.shape]``: every rank's ``arr`` (same shape and dtype on all)."""
        t = torch.from_numpy(np.array(arr, copy=True))
        out = [torch.empty_like(t) for _ in range(self.world)]
        self._run("all_gather", dist.all_gather, out, t)
        return torch.stack(out).numpy()

    def broadcast(self, arr: np.ndarray, root: int = 0) -> np.ndarray:
        """``root``'s 1-d ``arr`` on every rank (the others pass any array of that dtype)."""
        n = self.allgather(np.array([len(arr)], dtype=np.int64))[root, 0]
        mine = np.array(arr, copy=True) if self.rank == root else np.empty(n, arr.dtype)
        t = torch.from_numpy(mine)
        self._run("broadcast", dist.broadcast, t, src=root)
        return t.numpy()

    def barrier(self) -> None:
        # a barrier through a collective that honours the timeout on gloo
        self.allreduce_sum(np.zeros(1, dtype=np.int64))

    def fetch(self, bounds: np.ndarray, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        """``table`` values of global ``ids``, each answered by its owner (``bounds``:
        rank ``q`` owns ``bounds[q] .. bounds[q+1]-1`` and holds them as ``table``). In
        rounds of ``round_bytes`` of asks (int32 where every id fits); ``ids`` may be
        memory-mapped: a round reads its slice."""
        out = np.empty((len(ids), *table.shape[1:]), dtype=table.dtype)
        ask = np.int32 if int(bounds[-1]) < 1 << 31 else np.int64
        step = self.step(np.dtype(ask).itemsize)
        first = int(bounds[self.rank])
        for k in range(self.rounds(len(ids), step)):
            lo, hi = min(k * step, len(ids)), min((k + 1) * step, len(ids))
            piece = np.asarray(ids[lo:hi]).astype(ask)
            release(ids)
            dest = owners(bounds, piece)
            grouping = rank_order(dest, self.world)
            asks = self.exchange(by_rank(dest, self.world, piece, grouping=grouping))
            del piece, dest
            answers = self.exchange([table[a[:, 0] - first] for a in asks])
            out[lo + grouping[0]] = np.concatenate(answers)
        return out
