from __future__ import annotations

import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st
from zmq.utils import z85

from graphrun.errors import ArgumentError
from graphrun.operator.keys import curve_keypair, curve_public, z85_decode, z85_encode


def test_rfc32_test_vector() -> None:
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(data) == "HelloWorld"
    assert z85_decode("HelloWorld") == data


def test_matches_libzmq_encoding() -> None:
    for n in (0, 4, 32, 64):
        data = bytes(range(n))
        assert z85_encode(data) == z85.encode(data).decode()


def test_keypair_is_what_zmq_makes() -> None:
    pair = curve_keypair()
    assert len(pair.public) == len(pair.secret) == 40
    assert zmq.curve_public(pair.secret.encode()).decode() == pair.public
    zpub, zsec = zmq.curve_keypair()
    assert curve_public(zsec.decode()) == zpub.decode()
    assert curve_keypair() != pair


def test_zmq_accepts_the_keys() -> None:
    server, client = curve_keypair(), curve_keypair()
    ctx = zmq.Context()
    try:
        rep = ctx.socket(zmq.REP)
        rep.curve_server = True
        rep.curve_secretkey = server.secret.encode()
        port = rep.bind_to_random_port("tcp://127.0.0.1")
        req = ctx.socket(zmq.REQ)
        req.curve_serverkey = server.public.encode()
        req.curve_publickey = client.public.encode()
        req.curve_secretkey = client.secret.encode()
        req.connect(f"tcp://127.0.0.1:{port}")
        req.send(b"ping")
        assert rep.poll(5000)
        assert rep.recv() == b"ping"
    finally:
        ctx.destroy(linger=0)


@pytest.mark.parametrize("bad", ["abc", "#####", "Hell~"])
def test_bad_z85(bad: str) -> None:
    with pytest.raises(ArgumentError):
        z85_decode(bad)


def test_bad_length() -> None:
    with pytest.raises(ArgumentError):
        z85_encode(b"abc")


@given(st.binary(max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_z85_round_trip(data: bytes) -> None:
    text = z85_encode(data)
    assert len(text) == len(data) // 4 * 5
    assert z85_decode(text) == data
    assert text == z85.encode(data).decode()
