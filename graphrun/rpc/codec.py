"""The wire codec: a pure ``encode(msg) -> frames`` / ``decode(frames) -> msg``, no socket I/O.

Frame layout of one message (a ZeroMQ multipart message; a ROUTER socket adds the
peer identity frame in front, which the transport strips before decoding)::

    frame 0        header: msgpack map (at most Limits.max_header_bytes bytes)
                     "v"  int            protocol version, must equal PROTOCOL_VERSION
                     "k"  int            MsgKind: 1 request, 2 reply, 3 error
                     "op" str            operation name ("pull", "push", "sample_neighbors", ...)
                     "id" int            request id chosen by the client, echoed by the reply
                     "b"  map            body: msgpack-able scalars, strings, lists and maps
                     "t"  [[dtype, [d0, d1, ...]], ...]   one entry per tensor frame
    frame 1..n     tensor i: the raw C-order bytes of an array of dtype t[i][0] and
                   shape t[i][1]; nothing else (no padding, no per-frame header)

Tensors are never copied by the codec: ``encode`` hands out the arrays' own
buffers (made C-contiguous if they were not) and ``decode`` wraps received frames
with ``numpy.frombuffer`` (views on the frame memory: writable where the frame is, as
a received zmq frame is; read-only over bytes). Nothing is pickled: dtypes come from an
allow-list of plain numeric types.

Everything a peer controls is checked before it is trusted or allocated: the
frame count, the header size, the header's fields and types, the number of tensor
descriptors, every dtype, every shape (rank and non-negative dims) and that each
tensor frame holds exactly ``prod(shape) * itemsize`` bytes, all against
:class:`Limits`. Violations raise :class:`graphrun.errors.ProtocolError`.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack
import numpy as np

from graphrun.errors import ProtocolError

T = TypeVar("T")

PROTOCOL_VERSION = 1

#: dtypes that may travel on the wire (no object, no structured, no void).
ALLOWED_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)


_WIRE_DTYPES = {n: np.dtype(n) for n in ALLOWED_DTYPES}
_DTYPE_NAMES = {d: n for n, d in _WIRE_DTYPES.items()}  # native byte order only


def wire_dtype(name: object) -> np.dtype:
    """The dtype named ``name`` if it is one of :data:`ALLOWED_DTYPES` (given by its name,
    e.g. ``"float32"``, or any numpy spelling of one, e.g. ``"f4"``); ValueError if not.
    The one check for every dtype a peer names: tensor frames here, tensors a store
    creates (``init``) and tensor descriptions a client receives."""
    if isinstance(name, str) and name in _WIRE_DTYPES:  # the names frames carry: no lookup
        return _WIRE_DTYPES[name]
    dtype = None
    if isinstance(name, (str, type, np.dtype)):  # a name, a scalar type or a dtype
        with contextlib.suppress(TypeError, ValueError):
            dtype = np.dtype(name)
    if dtype is None or dtype.name not in ALLOWED_DTYPES or dtype.byteorder == ">":
        raise ValueError(f"dtype {name!r} is not one of {sorted(ALLOWED_DTYPES)}")
    return dtype


class MsgKind(enum.IntEnum):
    REQUEST = 1
    REPLY = 2
    ERROR = 3


_KINDS = {int(k): k for k in MsgKind}


@dataclass(frozen=True)
class Limits:
    """Upper bounds a receiver enforces before trusting a message."""

    max_frames: int = 64
    max_header_bytes: int = 1 << 20
    max_tensor_bytes: int = 1 << 34
    max_total_bytes: int = 1 << 35
    max_ndim: int = 8
    # The largest frame a server accepts (libzmq's MAXMSGSIZE, enforced before the CURVE
    # handshake too: an unauthenticated peer that declares a huge frame and streams it
    # costs the server at most this). Clients split bigger requests (store/client.py).
    max_request_frame_bytes: int = 1 << 26
    # The most a server lets one request (all its frames) take, whole or in the making
    # (graphrun.rpc.guard; clients send at most about 2 frames of half the frame limit).
    max_request_bytes: int = 1 << 28


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Message:
    """One wire message. ``tensors`` are numpy arrays; ``body`` is msgpack-able data."""

    kind: MsgKind
    op: str
    request_id: int
    body: Mapping[str, Any] = field(default_factory=dict)
    tensors: tuple[np.ndarray, ...] = ()


Frame = bytes | memoryview | np.ndarray


def encode(msg: Message) -> list[Frame]:
    """Frames for ``msg``: the msgpack header, then each tensor's buffer (not copied)."""
    descr = []
    frames: list[Frame] = [b""]
    for i, t in enumerate(msg.tensors):
        a = np.asarray(t)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")
        name = _DTYPE_NAMES.get(a.dtype)  # (dtype.name is a Python-level property, µs)
        if name is None and a.dtype.byteorder == ">":  # sent as it is, read back as garbage
            a = a.astype(a.dtype.newbyteorder("="))
            name = _DTYPE_NAMES.get(a.dtype)
        if name is None:
            raise ProtocolError(f"tensor {i}: dtype {a.dtype} cannot be sent", kind=msg.op)
        descr.append([name, a.shape])  # a tuple packs as a list does
        # flat 1-d (a view, C-contiguous), so any buffer consumer takes it
        frames.append(a if a.ndim == 1 else a.reshape(-1))
    body = msg.body if type(msg.body) is dict else dict(msg.body)
    header = {"v": PROTOCOL_VERSION, "k": int(msg.kind), "op": msg.op,
              "id": int(msg.request_id), "b": body, "t": descr}  # fmt: skip
    try:
        frames[0] = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"body is not msgpack-able ({exc})", kind=msg.op) from exc
    return frames


def _buffer(frame: Any) -> memoryview:
    """A memoryview of a received frame (bytes, memoryview, zmq.Frame or array)."""
    buf = getattr(frame, "buffer", None)  # zmq.Frame: a memoryview, kept by the frame
    if buf is not None:
        return buf if type(buf) is memoryview else memoryview(buf)
    return memoryview(frame)


def _header(raw: memoryview, limits: Limits) -> dict[str, Any]:
    if raw.nbytes > limits.max_header_bytes:
        raise ProtocolError(f"header of {raw.nbytes} bytes exceeds {limits.max_header_bytes}")
    try:
        header = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
        )
    except Exception as exc:  # msgpack raises many unrelated types on garbage
        raise ProtocolError(f"header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a msgpack map")
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} is not {PROTOCOL_VERSION}")
    return header


def _field(header: dict[str, Any], key: str, typ: type[T]) -> T:
    val = header.get(key)
    if type(val) is not typ:  # msgpack makes the plain types (and a bool is no int)
        raise ProtocolError(f"header field {key!r} is missing or not {typ.__name__}")
    return val


def _tensor_spec(i: int, d: Any, limits: Limits) -> tuple[np.dtype, tuple[int, ...], int]:
    if not (type(d) is list and len(d) == 2 and type(d[1]) is list):  # as msgpack makes them
        raise ProtocolError(f"tensor {i}: descriptor is not [dtype, shape]")
    name, shape = d
    dtype = _WIRE_DTYPES.get(name) if type(name) is str else None  # names only, no spellings
    if dtype is None:
        raise ProtocolError(f"tensor {i}: dtype {name!r} is not allowed")
    if len(shape) > limits.max_ndim:
        raise ProtocolError(f"tensor {i}: rank {len(shape)} exceeds {limits.max_ndim}")
    nbytes = dtype.itemsize
    for s in shape:
        if type(s) is not int or s < 0:  # (a bool is no int here)
            raise ProtocolError(f"tensor {i}: shape {shape!r} is not a list of non-negative ints")
        nbytes *= s
    if nbytes > limits.max_tensor_bytes:
        raise ProtocolError(f"tensor {i}: {nbytes} bytes exceeds {limits.max_tensor_bytes}")
    return dtype, tuple(shape), nbytes


def peek_request(frames: Sequence[Any]) -> tuple[int, str]:
    """Best-effort (request id, op) of a message that failed to decode, for the error reply."""
    try:
        raw = _buffer(frames[0])
        if raw.nbytes > DEFAULT_LIMITS.max_header_bytes:
            return 0, ""
        h = msgpack.unpackb(raw, raw=False)
        rid, op = h.get("id", 0), h.get("op", "")
        return (rid if isinstance(rid, int) and rid >= 0 else 0), (
            op if isinstance(op, str) else ""
        )
    except Exception:
        return 0, ""


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse and validate ``frames``; tensors are views on the frame memory (see above)."""
    if not frames:
        raise ProtocolError("empty message")
    if len(frames) > limits.max_frames:
        raise ProtocolError(f"{len(frames)} frames exceed the limit of {limits.max_frames}")
    header = _header(_buffer(frames[0]), limits)
    kind_val = _field(header, "k", int)
    kind = _KINDS.get(kind_val)  # (MsgKind(...) is an enum call, ~1 us)
    if kind is None:
        raise ProtocolError(f"message kind {kind_val} is unknown")
    op = _field(header, "op", str)
    rid = _field(header, "id", int)
    body = _field(header, "b", dict)
    descr = _field(header, "t", list)
    if len(descr) != len(frames) - 1:
        raise ProtocolError(
            f"header declares {len(descr)} tensors but {len(frames) - 1} frames follow", kind=op
        )
    specs = [_tensor_spec(i, d, limits) for i, d in enumerate(descr)]
    if sum(s[2] for s in specs) > limits.max_total_bytes:
        total = sum(s[2] for s in specs)
        raise ProtocolError(f"{total} tensor bytes exceed {limits.max_total_bytes}", kind=op)
    tensors = []
    for i, ((dtype, shape, nbytes), frame) in enumerate(zip(specs, frames[1:], strict=True)):
        buf = _buffer(frame)
        if buf.nbytes != nbytes:
            raise ProtocolError(
                f"tensor {i}: frame has {buf.nbytes} bytes, shape {list(shape)} of {dtype} "
                f"needs {nbytes}",
                kind=op,
            )
        if not nbytes:
            tensors.append(np.empty(shape, dtype))
            continue
        if buf.ndim != 1 or buf.format != "B":  # a zmq frame's is already
            buf = buf.cast("B")
        arr = np.frombuffer(buf, dtype=dtype)
        tensors.append(arr if len(shape) == 1 else arr.reshape(shape))
    return Message(kind=kind, op=op, request_id=rid, body=body, tensors=tuple(tensors))


def error_message(request_id: int, op: str, error_type: str, text: str) -> Message:
    """The ERROR reply for a request: ``body = {"type": ..., "message": ...}``."""
    return Message(MsgKind.ERROR, op, request_id, {"type": error_type, "message": text})
