import json
import stat

import pytest

from graphrun.errors import ArgumentError
from graphrun.rpc.auth import KeyPair, generate_keys, load_keys


def test_generate_and_load(tmp_path):
    path = tmp_path / "job.key"
    keys = generate_keys(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_keys(path) == keys
    assert keys.secret not in repr(keys)
    assert generate_keys(tmp_path / "other.key") != keys  # never the same pair twice


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "cannot read key file"),
        (json.dumps({"format": "x"}), "'format'"),
        (json.dumps({"format": "graphrun-key", "version": 9}), "'version' is 9"),
        (json.dumps({"format": "graphrun-key", "version": 1, "public": "a"}), "KeyPair.public"),
    ],
)
def test_bad_key_files(tmp_path, content, match):
    path = tmp_path / "bad.key"
    path.write_text(content)
    with pytest.raises(ArgumentError, match=match):
        load_keys(path)


def test_missing_key_file(tmp_path):
    with pytest.raises(ArgumentError, match="cannot read"):
        load_keys(tmp_path / "none.key")
    with pytest.raises(ArgumentError):
        KeyPair("x" * 40, "short")


def _serve_for(server, seconds):
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        server.poll(20)


def test_a_tcp_probe_is_not_logged_as_an_attack_and_a_wrong_key_names_the_peer(caplog, monkeypatch):
    # the worker's readiness probe and the pod's tcpSocket probe logged "WARNING refused a
    # connection from <the server's own address>" every 5 s
    import logging
    import socket

    import zmq

    from graphrun.rpc import auth
    from graphrun.rpc.auth import new_keypair, secure_client
    from graphrun.rpc.transport import RpcServer

    # a fresh limit of refusals logged: the process's may be spent by earlier tests in
    # this worker (10 a minute), and the one line asked for below was dropped
    monkeypatch.setattr(auth.REFUSED, "_start", 0.0)
    monkeypatch.setattr(auth.REFUSED, "_count", 0)
    monkeypatch.setattr(auth.REFUSED, "_dropped", 0)

    keys = new_keypair()
    server = RpcServer("tcp://127.0.0.1:0", lambda req: req, keys=keys, name="s0")
    host, port = server.address.removeprefix("tcp://").rsplit(":", 1)
    try:
        with caplog.at_level(logging.DEBUG, logger="graphrun.rpc"):
            for _ in range(3):
                socket.create_connection((host, int(port)), timeout=2).close()
            _serve_for(server, 0.5)
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            secure_client(sock, new_keypair())  # a client key this server does not admit
            sock.curve_serverkey = keys.public.encode("ascii")
            sock.connect(server.address)
            sock.send(b"x")
            _serve_for(server, 1.0)
            sock.close()
            ctx.term()
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warnings == ["s0: refused a connection from 127.0.0.1: wrong or missing job key"]
    finally:
        server.close()


def test_refusals_are_rate_limited(caplog):
    import logging

    from graphrun.rpc.auth import RateLimitedLog

    limited = RateLimitedLog(logging.getLogger("graphrun.test"), burst=3, window_s=60)
    with caplog.at_level(logging.WARNING, logger="graphrun.test"):
        for i in range(100):
            limited.warning("bad message %d", i)
    assert [r.getMessage() for r in caplog.records] == [f"bad message {i}" for i in range(3)]


def test_key_files_are_never_written_through_a_planted_file_or_link(tmp_path, monkeypatch):
    """The temp file was opened without O_EXCL|O_NOFOLLOW under a predictable name: a stale
    0644 temp file kept its mode, a planted symlink received the secret."""
    import os

    monkeypatch.setattr(os, "getpid", lambda: 4242)
    outside = tmp_path / "outside"
    outside.write_text("")
    os.symlink(outside, tmp_path / ".job.key.tmp-4242")
    stale = tmp_path / ".other.key.tmp-4242"
    stale.write_text("old")
    os.chmod(stale, 0o644)
    keys = generate_keys(tmp_path / "job.key")
    generate_keys(tmp_path / "other.key")
    assert outside.read_text() == ""
    for name in ("job.key", "other.key"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == 0o600
    assert load_keys(tmp_path / "job.key") == keys


def test_ensure_keys_makes_the_file_once(tmp_path):
    from graphrun.rpc.auth import ensure_keys

    keys, made = ensure_keys(tmp_path / "store.key")
    again, made_again = ensure_keys(tmp_path / "store.key")
    assert made and not made_again and again == keys


def test_a_key_file_with_non_z85_or_mismatched_keys_is_refused(tmp_path):
    """Non-Z85 characters reached libzmq as a raw ZMQError."""
    import json

    keys = generate_keys(tmp_path / "job.key")
    data = json.loads((tmp_path / "job.key").read_text())
    bad = tmp_path / "bad.key"
    bad.write_text(json.dumps({**data, "secret": "~" * 40}))
    with pytest.raises(ArgumentError, match="40-character Z85"):
        load_keys(bad)
    other = generate_keys(tmp_path / "other.key")
    bad.write_text(json.dumps({**data, "public": other.public}))
    with pytest.raises(ArgumentError, match="not the secret key's"):
        load_keys(bad)
    bad.write_text(json.dumps(data))  # a good key, left open to others (write_text: 0644)
    with pytest.raises(ArgumentError, match="chmod 600"):
        load_keys(bad)
    assert load_keys(tmp_path / "job.key") == keys
