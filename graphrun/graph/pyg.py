"""PyTorch Geometric interop: ``Data``/``HeteroData`` ⇄ :class:`Graph`.

Names are translated both ways so that a round trip is the identity:

=================  =====================
graphrun            PyG
=================  =====================
ndata ``feat``      ``x``
ndata ``label``     ``y``
edata ``feat``      ``edge_attr``
other names         same name
homogeneous graph   ``Data``
heterograph         ``HeteroData`` (node types in graphrun's order, per-type ids)
=================  =====================

Node-level attributes are the tensors whose first dimension is the node count
(PyG's ``is_node_attr``); edge-level ones likewise (``is_edge_attr``). Anything
else (graph-level scalars, strings) is not carried over. torch is imported lazily:
``graphrun.graph`` itself needs only numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from graphrun.errors import DatasetError
from graphrun.graph.graph import DEFAULT_ETYPE, DEFAULT_NTYPE, Graph
from graphrun.names import etype_key

if TYPE_CHECKING:
    import torch
    from torch_geometric.data import Data, HeteroData

NODE_TO_PYG = {"feat": "x", "label": "y"}
EDGE_TO_PYG = {"feat": "edge_attr"}
NODE_FROM_PYG = {v: k for k, v in NODE_TO_PYG.items()}
EDGE_FROM_PYG = {v: k for k, v in EDGE_TO_PYG.items()}
SKIP = {"edge_index", "num_nodes", "adj_t"}


def _to_numpy(where: str, value: Any) -> np.ndarray:
    import torch

    if not isinstance(value, torch.Tensor):
        raise DatasetError(f"{where}: expected a tensor, got {type(value).__name__}")
    if value.is_sparse or value.layout != torch.strided:
        raise DatasetError(f"{where}: sparse tensors are not supported")
    t = value.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.contiguous().numpy()


def _rename(name: str, table: dict[str, str], where: str, seen: dict[str, np.ndarray]) -> str:
    new = table.get(name, name)
    if new in seen:
        raise DatasetError(f"{where}: attributes {name!r} and {new!r} map to the same name")
    return new


def _edge_index(where: str, value: Any, n_src: int, n_dst: int) -> tuple[np.ndarray, np.ndarray]:
    ei = _to_numpy(f"{where}.edge_index", value)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DatasetError(f"{where}.edge_index: expected shape [2, E], got {list(ei.shape)}")
    if not np.issubdtype(ei.dtype, np.integer):
        raise DatasetError(f"{where}.edge_index: expected an integer dtype, got {ei.dtype}")
    src, dst = ei[0].astype(np.int64), ei[1].astype(np.int64)
    for end, arr, n in (("source", src, n_src), ("target", dst, n_dst)):
        bad = (arr < 0) | (arr >= n)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"{where}.edge_index: {end} id {int(arr[i])} at edge {i} is out of range [0, {n})"
            )
    return src, dst


def from_pyg(data: Any, name: str = "graph") -> Graph:
    """Convert a PyG ``Data`` or ``HeteroData`` to a :class:`Graph`."""
    from torch_geometric.data import Data, HeteroData

    if isinstance(data, HeteroData):
        return _from_hetero(data, name)
    if not isinstance(data, Data):
        raise DatasetError(f"expected a torch_geometric Data or HeteroData, got {type(data)}")
    if data.num_nodes is None or data.edge_index is None:
        raise DatasetError("Data: needs edge_index and a node count (x or num_nodes)")
    n = int(data.num_nodes)
    src, dst = _edge_index("Data", data.edge_index, n, n)
    ndata: dict[str, np.ndarray] = {}
    edata: dict[str, np.ndarray] = {}
    for key, value in data.items():
        if key in SKIP:
            continue
        if data.is_node_attr(key):
            ndata[_rename(key, NODE_FROM_PYG, f"Data.{key}", ndata)] = _to_numpy(
                f"Data.{key}", value
            )
        elif data.is_edge_attr(key):
            edata[_rename(key, EDGE_FROM_PYG, f"Data.{key}", edata)] = _to_numpy(
                f"Data.{key}", value
            )
    return Graph(
        num_nodes=n,
        src=src,
        dst=dst,
        ndata={DEFAULT_NTYPE: ndata} if ndata else {},
        edata={etype_key(DEFAULT_ETYPE): edata} if edata else {},
        name=name,
    )


def _from_hetero(data: Any, name: str) -> Graph:
    ntypes = tuple(data.node_types)
    counts = []
    for t in ntypes:
        n = data[t].num_nodes
        if n is None:
            raise DatasetError(f"HeteroData[{t!r}]: no node count (x or num_nodes)")
        counts.append(int(n))
    offsets = dict(zip(ntypes, np.concatenate([[0], np.cumsum(counts)]).tolist(), strict=False))
    size = dict(zip(ntypes, counts, strict=True))
    ndata: dict[str, dict[str, np.ndarray]] = {}
    for t in ntypes:
        store = data[t]
        feats: dict[str, np.ndarray] = {}
        for key, value in store.items():
            if key in SKIP or not store.is_node_attr(key):
                continue
            where = f"HeteroData[{t!r}].{key}"
            feats[_rename(key, NODE_FROM_PYG, where, feats)] = _to_numpy(where, value)
        if feats:
            ndata[t] = feats
    srcs, dsts, ecounts, edata = [], [], [], {}
    for et in data.edge_types:
        store = data[et]
        where = f"HeteroData[{etype_key(et)!r}]"
        if "edge_index" not in store:
            raise DatasetError(f"{where}: no edge_index")
        s, d = _edge_index(where, store.edge_index, size[et[0]], size[et[2]])
        srcs.append(s + offsets[et[0]])
        dsts.append(d + offsets[et[2]])
        ecounts.append(len(s))
        feats = {}
        for key, value in store.items():
            if key in SKIP or not store.is_edge_attr(key):
                continue
            feats[_rename(key, EDGE_FROM_PYG, f"{where}.{key}", feats)] = _to_numpy(
                f"{where}.{key}", value
            )
        if feats:
            edata[etype_key(et)] = feats
    empty = np.empty(0, dtype=np.int64)
    return Graph(
        num_nodes=int(sum(counts)),
        src=np.concatenate(srcs) if srcs else empty,
        dst=np.concatenate(dsts) if dsts else empty,
        node_types=ntypes,
        edge_types=tuple(tuple(e) for e in data.edge_types),
        node_type_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        edge_type_offsets=np.concatenate([[0], np.cumsum(ecounts)]).astype(np.int64),
        ndata=ndata,
        edata=edata,
        name=name,
    )


def _tensor(arr: np.ndarray) -> torch.Tensor:
    import torch

    arr = np.ascontiguousarray(arr)
    if not arr.flags.writeable:  # memory-mapped read-only: torch wants a writable buffer
        arr = arr.copy()
    return torch.from_numpy(arr)


def to_pyg(graph: Graph) -> Data | HeteroData:
    """Convert a :class:`Graph` to PyG: ``Data`` if homogeneous, else ``HeteroData``.

    Contiguous writable arrays are shared with the tensors; read-only (memory-mapped)
    ones are copied.
    """
    import torch
    from torch_geometric.data import Data, HeteroData

    if not graph.is_hetero:
        data = Data(
            edge_index=torch.stack([_tensor(graph.src), _tensor(graph.dst)]),
            num_nodes=graph.num_nodes,
        )
        for key, arr in graph.ndata.get(graph.node_types[0], {}).items():
            data[NODE_TO_PYG.get(key, key)] = _tensor(arr)
        for key, arr in graph.edata.get(etype_key(graph.edge_types[0]), {}).items():
            data[EDGE_TO_PYG.get(key, key)] = _tensor(arr)
        return data
    hdata = HeteroData()
    nto, eto = graph.node_type_offsets, graph.edge_type_offsets
    assert nto is not None and eto is not None
    for t in graph.node_types:
        hdata[t].num_nodes = graph.num_nodes_of(t)
        for key, arr in graph.ndata.get(t, {}).items():
            hdata[t][NODE_TO_PYG.get(key, key)] = _tensor(arr)
    for r, et in enumerate(graph.edge_types):
        a, b = int(eto[r]), int(eto[r + 1])
        s = graph.src[a:b] - nto[graph.node_types.index(et[0])]
        d = graph.dst[a:b] - nto[graph.node_types.index(et[2])]
        hdata[et].edge_index = torch.stack([_tensor(s), _tensor(d)])
        for key, arr in graph.edata.get(etype_key(et), {}).items():
            hdata[et][EDGE_TO_PYG.get(key, key)] = _tensor(arr)
    return hdata
