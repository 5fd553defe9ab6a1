"""``DistTensor``: a tensor whose rows live on the store servers, split by a partition policy.

    feat = DistTensor(client, "node/paper/feat")                  # graph data
    h = DistTensor(client, "h", shape=(n, 64), policy="node:paper")  # a job tensor
    x = h[ids]            # pull: a torch tensor in the order of ids
    h[ids] = x * 2        # push with the "assign" reducer

Creating a tensor that already exists in the job (another trainer made it) attaches
to it when dtype, shape and policy agree. ``persistent=False`` tensors are freed by
the servers when the last client of the job leaves (or is dropped after missing
heartbeats); persistent ones stay until :meth:`DistTensor.delete`.

Pulled tensors share memory with the received frame or the gather buffer (no copy
is made); they are fresh buffers owned by the caller.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np
import torch

from graphrun.errors import ArgumentError
from graphrun.names import PolicyName
from graphrun.store.client import KVClient, Reduction
from graphrun.store.policy import lookup_policy
from graphrun.store.state import TensorInfo


def to_numpy_ids(ids: Any) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        return ids.detach().cpu().numpy()
    if isinstance(ids, slice):
        raise ArgumentError("ids: slices are not supported, pass an array of ids")
    return np.asarray(ids)


def as_torch(arr: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` without a copy; received frames are flagged read-only by numpy,
    but their memory belongs to this process alone, so writing to them is safe."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


class DistTensor:
    """Rows of a store tensor, pulled with ``t[ids]`` and pushed with ``t[ids] = v``."""

    def __init__(
        self,
        client: KVClient,
        name: str,
        shape: Sequence[int] | None = None,
        dtype: Any = "float32",
        policy: PolicyName | str | None = None,
        *,
        init: str = "zeros",
        init_args: Mapping[str, Any] | None = None,
        persistent: bool = False,
    ) -> None:
        self.client = client
        self.name = name
        if shape is None:
            self.info: TensorInfo = client.meta(name)
        else:
            if policy is None:
                ntypes = client.book.node_types
                if len(ntypes) != 1:
                    raise ArgumentError(f"policy: needed for {name!r} on a heterograph")
                policy = PolicyName.node(ntypes[0])
            np_dtype = np.dtype(str(dtype).replace("torch.", ""))
            rows = lookup_policy(client.policies, policy).num_rows
            if len(shape) < 1 or shape[0] != rows:
                raise ArgumentError(
                    f"shape: first dimension {list(shape)[:1]} must be the {rows} ids of {policy}"
                )
            self.info = client.init_tensor(
                name,
                policy,
                tuple(shape[1:]),
                np_dtype.name,
                init=init,
                init_args=init_args,
                persistent=persistent,
                exist_ok=True,
            )
            if self.info.shape != tuple(shape) or self.info.dtype != np_dtype.name:
                raise ArgumentError(
                    f"{name!r} exists with shape {self.info.shape} dtype {self.info.dtype}, "
                    f"not {tuple(shape)} {np_dtype.name}"
                )

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.info.shape)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the rows ``t[ids]`` returns (``np_dtype``: numpy's)."""
        return torch.from_numpy(np.empty(0, self.np_dtype)).dtype

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.info.dtype)

    @property
    def device(self) -> torch.device:
        """Where ``t[ids]`` puts the rows: the CPU (move them with ``.to(device)``)."""
        return torch.device("cpu")

    @property
    def ndim(self) -> int:
        return len(self.info.shape)

    @overload
    def size(self, dim: None = None) -> torch.Size: ...
    @overload
    def size(self, dim: int) -> int: ...
    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    @property
    def policy(self) -> str:
        return self.info.policy

    def __len__(self) -> int:
        return self.info.num_rows

    def pull_numpy(self, ids: Any) -> np.ndarray:
        return self.client.pull(self.name, to_numpy_ids(ids))

    def local_block(self, near: Any = None) -> tuple[int, torch.Tensor] | None:
        """``(first, rows)``: the rows ``first ..`` of a partition on this machine (the one
        owning most of the ids ``near``), read in place from its shared memory (never
        written through: the owner's server writes them); None when there is none
        (:meth:`KVClient.local_block`)."""
        near = None if near is None else to_numpy_ids(near)
        got = self.client.local_block(self.name, near)
        return None if got is None else (got[0], as_torch(got[1]))

    @overload
    def reduce(self, how: Literal["nonzero"]) -> np.ndarray: ...
    @overload
    def reduce(self, how: Reduction) -> float | None: ...
    def reduce(self, how: Literal["nonzero"] | Reduction) -> np.ndarray | float | None:
        """A reduction computed by the servers (see :meth:`KVClient.reduce`)."""
        return self.client.reduce(self.name, how)

    def __getitem__(self, ids: Any) -> torch.Tensor:
        return as_torch(self.pull_numpy(ids))

    def __setitem__(self, ids: Any, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        arr = np.asarray(value, dtype=self.np_dtype)
        ids_np = to_numpy_ids(ids)
        if arr.shape != (len(ids_np), *self.info.row_shape):
            arr = np.broadcast_to(arr, (len(ids_np), *self.info.row_shape))
        self.client.push(self.name, ids_np, np.ascontiguousarray(arr), "assign")

    def delete(self) -> None:
        self.client.delete_tensor(self.name)

    def __repr__(self) -> str:
        return f"DistTensor({self.name!r}, shape={self.shape}, dtype={self.dtype}, {self.policy})"
