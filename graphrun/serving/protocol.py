"""The Open Inference Protocol (KServe v2 REST) as the endpoint speaks it.

A request (``POST /v2/models/<name>/infer``, JSON)::

    {"id": "optional, echoed",
     "parameters": {"mode": "sampled" | "full" | "precomputed", "seed": 0},
     "inputs": [{"name": "node_ids", "shape": [n], "datatype": "INT64", "data": [...]}],
     "outputs": [{"name": "logits"}, {"name": "predictions"}, {"name": "embeddings"}]}

or, for a node not in the graph, ``features`` (FP32, shape ``[1, F]``) and ``neighbors``
(INT64, shape ``[k]``: its in-neighbours, ids of the graph). ``data`` is flat or nested
as ``shape`` says (row-major). ``outputs`` picks answers (default: logits and
predictions). The answer::

    {"model_name": ..., "id": ..., "parameters": {"mode": ..., "seed": ...},
     "outputs": [{"name": "logits", "shape": [n, C], "datatype": "FP32", "data": [...]},
                 {"name": "predictions", "shape": [n], "datatype": "INT64", "data": [...]}]}

Everything here is checked against :class:`Bounds` before any work is queued: a bad
request is a :class:`BadRequest`, answered as HTTP 400 ``{"error": "<one line>"}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from graphrun.errors import BadRequest

Mode = Literal["sampled", "full", "precomputed"]
MODES: tuple[Mode, ...] = ("sampled", "full", "precomputed")
OUTPUTS = ("logits", "predictions", "embeddings")
DEFAULT_OUTPUTS = ("logits", "predictions")
MAX_SEED = 2**62
FEW_IDS = 64  # a request's ids checked as Python ints up to this many (numpy's past it)


def _flag(help_: str | None) -> dict[str, Any]:
    """A field's ``graphrun infer serve`` flag (:func:`graphrun.arguments.add_fields`)."""
    return {"help": help_, "quiet": True}


@dataclass(frozen=True)
class Bounds:
    """What one request and one micro-batch may ask: the endpoint's ``--max-*`` flags,
    taken from these fields (their help in the metadata)."""

    max_body_bytes: int = field(default=1 << 20, metadata=_flag(None))
    max_ids: int = field(default=1024, metadata=_flag("node ids of one request"))
    max_neighbors: int = field(default=1024, metadata=_flag("edges of a new node"))
    # ids of one micro-batch (one forward)
    max_batch_ids: int = field(default=4096, metadata=_flag("ids of one forward"))
    # requests waiting or in a forward; more are refused (HTTP 503)
    max_queue: int = field(default=256, metadata=_flag("requests in flight (more: 503)"))


@dataclass(frozen=True)
class Query:
    """One checked request: node ids, or a new node (``features`` and ``neighbors``)."""

    mode: Mode
    seed: int
    outputs: tuple[str, ...]
    ids: np.ndarray | None = None  # int64 [n], distinct
    features: np.ndarray | None = None  # float32 [F]
    neighbors: np.ndarray | None = None  # int64 [k], distinct

    @property
    def size(self) -> int:
        return 1 if self.ids is None else int(self.ids.size)


@dataclass(frozen=True)
class Graph:
    """What a request is checked against: the graph's node count and feature width."""

    num_nodes: int
    in_dim: int


def _flat(name: str, data: Any, depth: int = 0) -> list[Any]:
    if not isinstance(data, list):
        raise BadRequest(f"inputs.{name}.data: expected a list")
    if depth > 2:
        raise BadRequest(f"inputs.{name}.data: nested deeper than its shape")
    out: list[Any] = []
    for v in data:
        out.extend(_flat(name, v, depth + 1) if isinstance(v, list) else [v])
    return out


def _tensor(item: Any, datatype: str, ndim: tuple[int, ...]) -> tuple[str, np.ndarray]:
    """An input's name and its data as a numpy array, checked against its shape."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise BadRequest("inputs: each input is an object with a name")
    name = item["name"]
    if item.get("datatype") != datatype:
        raise BadRequest(
            f"inputs.{name}.datatype: expected {datatype}, got {item.get('datatype')!r}"
        )
    shape = item.get("shape")
    if (
        not isinstance(shape, list) or len(shape) not in ndim
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):  # fmt: skip
        raise BadRequest(f"inputs.{name}.shape: expected {' or '.join(map(str, ndim))} sizes")
    flat = _flat(name, item.get("data"))
    if len(flat) != math.prod(shape):
        raise BadRequest(
            f"inputs.{name}: shape {shape} holds {math.prod(shape)} values, data {len(flat)}"
        )
    if datatype == "INT64":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
            raise BadRequest(f"inputs.{name}.data: expected integers")
        if flat and not -(2**63) <= min(flat) <= max(flat) < 2**63:
            raise BadRequest(f"inputs.{name}.data: an id beyond int64")
        return name, np.asarray(flat, dtype=np.int64)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in flat):
        raise BadRequest(f"inputs.{name}.data: expected numbers")
    arr = np.asarray(flat, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise BadRequest(f"inputs.{name}.data: a value is not finite in float32")
    return name, arr


def _ids(name: str, ids: np.ndarray, graph: Graph, limit: int) -> np.ndarray:
    if ids.size == 0:
        raise BadRequest(f"inputs.{name}: no ids")
    if ids.size > limit:
        raise BadRequest(f"inputs.{name}: {ids.size} ids, at most {limit} a request")
    if ids.size <= FEW_IDS:  # Python's ints: numpy's calls cost more than a few ids' checks
        vals = ids.tolist()
        bad = [v for v in vals if not 0 <= v < graph.num_nodes][:1]
        twice = len(set(vals)) != len(vals)
    else:
        bad = ids[(ids < 0) | (ids >= graph.num_nodes)][:1].tolist()
        twice = True  # np.unique tells
    if bad:
        raise BadRequest(
            f"inputs.{name}: id {bad[0]} is not a node (ids are below {graph.num_nodes})"
        )
    if twice:
        uniq, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise BadRequest(f"inputs.{name}: id {int(uniq[counts > 1][0])} appears twice")
    return ids


def _params(body: dict[str, Any], default_mode: Mode, default_seed: int) -> tuple[Mode, int]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise BadRequest("parameters: expected an object")
    unknown = set(params) - {"mode", "seed"}
    if unknown:
        raise BadRequest(f"parameters: unknown {sorted(unknown)[0]!r} (known: mode, seed)")
    mode = params.get("mode", default_mode)
    if mode not in MODES:
        raise BadRequest(f"parameters.mode: {mode!r} is not one of {', '.join(MODES)}")
    seed = params.get("seed", default_seed)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < MAX_SEED:
        raise BadRequest(f"parameters.seed: expected an integer in [0, 2**62), got {seed!r}")
    return mode, seed


def _outputs(body: dict[str, Any]) -> tuple[str, ...]:
    wanted = body.get("outputs")
    if wanted is None:
        return DEFAULT_OUTPUTS
    if not isinstance(wanted, list) or not wanted:
        raise BadRequest('outputs: expected a non-empty list of {"name": ...}')
    names = []
    for o in wanted:
        name = o.get("name") if isinstance(o, dict) else None
        if name not in OUTPUTS:
            raise BadRequest(f"outputs: {name!r} is not one of {', '.join(OUTPUTS)}")
        names.append(name)
    return tuple(dict.fromkeys(names))


def parse(
    body: Any, graph: Graph, bounds: Bounds, default_mode: Mode = "sampled", default_seed: int = 0
) -> Query:
    """The checked :class:`Query` of a decoded request body; :class:`BadRequest` otherwise."""
    if not isinstance(body, dict):
        raise BadRequest("request: expected a JSON object")
    mode, seed = _params(body, default_mode, default_seed)
    outputs = _outputs(body)
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= 2:
        raise BadRequest("inputs: expected node_ids, or features and neighbors")
    names = [i.get("name") if isinstance(i, dict) else None for i in inputs]
    if names == ["node_ids"]:
        _, ids = _tensor(inputs[0], "INT64", (1,))
        return Query(mode, seed, outputs, ids=_ids("node_ids", ids, graph, bounds.max_ids))
    if sorted(map(str, names)) != ["features", "neighbors"]:
        raise BadRequest(f"inputs: {names} are not node_ids, or features and neighbors")
    if mode == "precomputed":
        raise BadRequest("parameters.mode: a new node has no precomputed answer")
    got = dict(
        _tensor(
            i,
            "FP32" if i["name"] == "features" else "INT64",
            (2,) if i["name"] == "features" else (1,),
        )
        for i in inputs
    )
    feats = got["features"]
    if feats.size != graph.in_dim or inputs[names.index("features")]["shape"][0] != 1:
        raise BadRequest(f"inputs.features: expected shape [1, {graph.in_dim}]")
    nbrs = _ids("neighbors", got["neighbors"], graph, bounds.max_neighbors)
    return Query(mode, seed, outputs, features=feats, neighbors=nbrs)


def answer(name: str, query: Query, rows: dict[str, np.ndarray], request_id: Any) -> dict[str, Any]:
    """The protocol's answer to ``query`` from its output rows."""
    types = {"logits": "FP32", "predictions": "INT64", "embeddings": "FP32"}
    outputs = [
        {
            "name": k,
            "shape": list(rows[k].shape),
            "datatype": types[k],
            "data": rows[k].ravel().tolist(),
        }
        for k in query.outputs
    ]
    out: dict[str, Any] = {"model_name": name, "outputs": outputs,
                           "parameters": {"mode": query.mode, "seed": query.seed}}  # fmt: skip
    if isinstance(request_id, str):
        out["id"] = request_id
    return out
