"""The trainers' TCP rendezvous: trainer 0's store listened on every interface
(torch's ``tcp://`` init), unauthenticated; it listens on the address it is given."""

from __future__ import annotations

import socket

import psutil
import pytest

from graphrun.errors import ArgumentError, GraphrunError
from graphrun.train.ddp import DDPConfig, process_group


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_trainer_0_listens_on_the_rendezvous_address_only() -> None:
    port = free_port()
    with process_group(DDPConfig(0, 1, f"127.0.0.1:{port}", backend="gloo", timeout_s=30)):
        here = [
            c.laddr.ip
            for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
    assert here == ["127.0.0.1"], here


def test_a_bad_rendezvous_is_one_line_naming_it() -> None:
    bad = DDPConfig(0, 2, "nonsense", backend="gloo", timeout_s=5)
    with pytest.raises(ArgumentError, match=r"^rendezvous: 'tcp://nonsense' is not tcp://HOST"):
        process_group(bad).__enter__()
    port = free_port()
    nobody = DDPConfig(1, 2, f"127.0.0.1:{port}", backend="gloo", timeout_s=1)
    with pytest.raises(GraphrunError, match=rf"^rendezvous tcp://127.0.0.1:{port}: rank 0 did"):
        process_group(nobody).__enter__()
