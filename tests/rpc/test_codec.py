import contextlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from graphrun.errors import ProtocolError
from graphrun.rpc.codec import (
    ALLOWED_DTYPES,
    PROTOCOL_VERSION,
    Limits,
    Message,
    MsgKind,
    decode,
    encode,
    peek_request,
)

dtypes = st.sampled_from(sorted(ALLOWED_DTYPES)).map(np.dtype)
arrays = dtypes.flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
)
bodies = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=10), st.booleans(), st.none()),
    max_size=5,
)


def _as_bytes(frames):
    return [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f for f in frames]


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(list(MsgKind)),
    op=st.text(max_size=20),
    rid=st.integers(0, 2**63 - 1),
    body=bodies,
    tensors=st.lists(arrays, max_size=4),
)
def test_round_trip(kind, op, rid, body, tensors):
    msg = Message(kind, op, rid, body, tuple(tensors))
    out = decode(_as_bytes(encode(msg)))
    assert (out.kind, out.op, out.request_id, out.body) == (kind, op, rid, body)
    assert len(out.tensors) == len(tensors)
    for a, b in zip(tensors, out.tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def test_encode_does_not_copy_contiguous_tensors():
    a = np.arange(1000, dtype=np.float32).reshape(100, 10)
    frames = encode(Message(MsgKind.REPLY, "pull", 1, {}, (a,)))
    assert np.shares_memory(frames[1], a)


def test_decode_does_not_copy_frames():
    a = np.arange(100, dtype=np.int64)
    frames = _as_bytes(encode(Message(MsgKind.REPLY, "pull", 1, {}, (a,))))
    out = decode(frames)
    assert np.shares_memory(out.tensors[0], np.frombuffer(frames[1], dtype=np.uint8))
    assert not out.tensors[0].flags.writeable


def test_non_contiguous_tensor_is_sent_in_c_order():
    a = np.arange(20, dtype=np.int32).reshape(4, 5).T
    out = decode(_as_bytes(encode(Message(MsgKind.REQUEST, "x", 1, {}, (a,)))))
    np.testing.assert_array_equal(out.tensors[0], a)


def test_a_big_endian_tensor_arrives_with_its_values():
    """A big-endian array was sent as it was, labelled by its dtype's name ("int64"),
    and read back in the receiver's byte order: other numbers."""
    a = np.arange(5, dtype=">i8")
    out = decode(_as_bytes(encode(Message(MsgKind.REQUEST, "x", 1, {}, (a,)))))
    np.testing.assert_array_equal(out.tensors[0], np.arange(5))


def test_object_dtype_is_refused():
    with pytest.raises(ProtocolError, match="cannot be sent"):
        encode(Message(MsgKind.REQUEST, "x", 1, {}, (np.array([object()]),)))


def _header(**over):
    h = {"v": PROTOCOL_VERSION, "k": 1, "op": "pull", "id": 7, "b": {}, "t": []}
    h.update(over)
    return msgpack.packb(h)


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([], "empty"),
        ([b"\xc1\xff\x00garbage"], "not valid msgpack"),
        ([msgpack.packb([1, 2])], "not a msgpack map"),
        ([_header(v=99)], "protocol version 99"),
        ([_header(k=9)], "kind 9"),
        ([_header(id="x")], "'id'"),
        ([_header(t=[["float32", [2]]])], "declares 1 tensors but 0"),
        ([_header(t=[["object", [1]]]), b"12345678"], "not allowed"),
        ([_header(t=[["float32", [-1]]]), b""], "non-negative"),
        ([_header(t=[["float32", [1] * 9]]), b"1234"], "rank 9"),
        ([_header(t=[["float32", [3]]]), b"12345678"], "frame has 8 bytes"),
        ([_header(t=[["float32", [1 << 40]]]), b""], "exceeds"),
        ([_header(), *([b""] * 100)], "frames exceed"),
    ],
)
def test_bad_frames_raise_protocol_error(frames, match):
    with pytest.raises(ProtocolError, match=match):
        decode(frames)


def test_header_size_is_checked_before_parsing():
    limits = Limits(max_header_bytes=64)
    with pytest.raises(ProtocolError, match="header of"):
        decode([_header(b={"x": "y" * 100})], limits)


def test_total_size_limit():
    limits = Limits(max_total_bytes=10)
    frames = [_header(t=[["uint8", [8]], ["uint8", [8]]]), b"a" * 8, b"b" * 8]
    with pytest.raises(ProtocolError, match="tensor bytes exceed"):
        decode(frames, limits)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_garbage_never_crashes(frames):
    with contextlib.suppress(ProtocolError):
        decode(frames)


def test_peek_request_recovers_id_and_op():
    assert peek_request([_header(v=99)]) == (7, "pull")
    assert peek_request([b"\xc1"]) == (0, "")
