"""``graphrun rendezvous``: the trainers' CURVE rendezvous served apart (docs/elastic.md,
"On Kubernetes"): trainers meet there, re-form there after trainer 0 is lost, and a
client without the job's key gets nothing."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from graphrun.cli import main
from graphrun.cli import rendezvous as cli
from graphrun.errors import RemoteError, RpcTimeout
from graphrun.job.hosts import free_ports
from graphrun.rpc.auth import generate_keys, load_keys, new_keypair
from graphrun.rpc.rendezvous import Limits, RendezvousServer
from graphrun.testing.elastic import until_a_peer_is_lost
from graphrun.testing.procs import run_then_exit, sent_then_exit, torch_processes
from graphrun.train.rendezvous import KeyStore

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_defaults_are_the_servers() -> None:
    d = Limits()
    limits = (d.max_keys, d.max_key, d.max_value, d.max_bytes)
    assert limits == (cli.MAX_KEYS, cli.MAX_KEY, cli.MAX_VALUE, cli.MAX_MB << 20)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--bind", "tcp://127.0.0.1"], "--bind: address: 'tcp://127.0.0.1' has no port"),
        (["--bind", "127.0.0.1:7000"], "--bind: '127.0.0.1:7000' is not tcp://HOST:PORT"),
        (["--bind", "tcp://*:99999"], "--bind: address: 'tcp://*:99999' has port"),
        (["--bind", "tcp://*:0", "--max-keys", "0"], "argument --max-keys: 0 is not in [1, "),
        (["--bind", "tcp://*:0", "--max-mb", "-1"], "argument --max-mb: -1 is not in [1, "),
    ],
)
def test_bad_arguments_are_one_line(argv: list[str], says: str, tmp_path: Path, capsys) -> None:
    key = tmp_path / "job.key"
    generate_keys(key)
    assert main(["rendezvous", *argv, "--key-file", str(key)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphrun: error: {says}") and err.count("\n") == 1, err


def test_a_missing_key_file_is_one_line(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.key"
    assert main(["rendezvous", "--bind", "tcp://*:0", "--key-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphrun: error: {missing}: cannot read key file")
    assert err.count("\n") == 1


def test_the_table_is_bounded() -> None:
    keys = new_keypair()
    limits = Limits(max_keys=3, max_key=8, max_value=16, max_bytes=40)
    server = RendezvousServer("tcp://127.0.0.1:*", keys, limits)
    store = KeyStore(server.endpoint, keys, timeout_s=5)
    try:
        with pytest.raises(RemoteError, match="key of 9 bytes, more than 8"):
            store.set("k" * 9, b"v")
        with pytest.raises(RemoteError, match="value of 17 bytes, more than 16"):
            store.set("a", b"v" * 17)
        store.set("a", b"v" * 16)
        store.set("b", b"v" * 16)  # 34 bytes
        with pytest.raises(RemoteError, match="more than 40 bytes"):
            store.set("c", b"v" * 16)
        store.set("a", b"v")  # a smaller value frees what the larger held
        store.set("c", b"v" * 16)
        with pytest.raises(RemoteError, match="3 keys already"):
            store.add("d", 1)
        assert store.num_keys() == 3 and store.get("c") == b"v" * 16
        assert store.delete_key("b")
        assert store.add("d", 1) == 1  # room again
        store.set("a", b"v" * 16)  # 17 + 17 + 2 bytes
        with pytest.raises(RemoteError, match="more than 40 bytes"):
            store.compare_set("d", b"1", b"v" * 16)
        assert store.get("d") == b"1"  # refused: unchanged
    finally:
        store.close()
        server.close()


def _serve(key: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphrun", "rendezvous", "--bind", f"tcp://127.0.0.1:{port}",
         "--key-file", str(key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the first line says it serves (or the process ended)
    assert line.startswith("graphrun rendezvous: serving on tcp://127.0.0.1:"), (
        line + proc.stderr.read() if proc.stderr else line
    )
    return proc


def _trainer(rank: int, rdv: str, key: str, out: mp.Queue, formed: Any) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch

    from graphrun.train.config import ElasticConfig
    from graphrun.train.ddp import DDPConfig, all_sum, process_group
    from graphrun.train.elastic import Regroup

    torch.set_num_threads(1)
    # served apart: no trainer serves it, trainer 0 joins like the others
    ddp = DDPConfig(rank, 3, rdv, timeout_s=60, keys=load_keys(key), serve_rendezvous=False)
    cfg = ElasticConfig(min_machines=2, timeout_s=20, settle_s=1.0)
    with process_group(ddp) as store:
        reg = Regroup(ddp, cfg, ("m0", "m1", "m2"), store)
        first = all_sum([float(rank + 1)], ddp)[0]
        out.put((rank, ("formed", first)))
        formed.wait(120)  # every first sum is in (gloo's last chunks too), however busy
        if rank == 0:
            sent_then_exit(out)  # trainer 0's machine is lost (what it put is sent first)
        if not until_a_peer_is_lost(ddp, lambda what: out.put((rank, what))):
            return
        new = reg.reform()
        total = all_sum([float(reg.ident)], new)[0]
        out.put((rank, ("re-formed", new.rank, new.world_size, total, reg.generation)))


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_trainers_form_and_re_form_without_trainer_0_through_it(tmp_path: Path) -> None:
    key = tmp_path / "job.key"
    generate_keys(key)
    (port,) = free_ports(1)
    server = _serve(key, port)
    procs: list = []
    try:
        maps = Path(f"/proc/{server.pid}/maps")
        if maps.exists():  # no torch in it: its pod's memory limit is 256Mi
            assert "libtorch" not in maps.read_text()
        ctx = torch_processes()
        out: mp.Queue = ctx.Queue()
        formed = ctx.Barrier(3)
        rdv = f"127.0.0.1:{port}"
        procs = [
            ctx.Process(target=run_then_exit, args=(_trainer, r, rdv, str(key), out, formed))
            for r in range(3)
        ]
        for p in procs:
            p.start()
        got: dict[int, list] = {}
        for _ in range(5):  # three "formed", two "re-formed"
            rank, what = out.get(timeout=180)
            got.setdefault(rank, []).append(what)
        assert got[0] == [("formed", 6.0)]
        # ranks 1 and 2 of the first group become 0 and 1 of 2 at generation 1; the sum
        # of their first-group ranks
        assert got[1] == [("formed", 6.0), ("re-formed", 0, 2, 3.0, 1)]
        assert got[2] == [("formed", 6.0), ("re-formed", 1, 2, 3.0, 1)]
        for p in procs:
            p.join(30)
        # a client without the job's key gets nothing, and changes nothing
        stranger = KeyStore(f"tcp://{rdv}", new_keypair(), timeout_s=1.5)
        try:
            with pytest.raises(RpcTimeout):
                stranger.get("elastic//g1/members")
            with pytest.raises(RpcTimeout):
                stranger.set("elastic//g2/members", b"6")
        finally:
            stranger.close()
        member = KeyStore(f"tcp://{rdv}", load_keys(key), timeout_s=5)
        try:
            assert not member.check(["elastic//g2/members"])
            # (torch.distributed.PrefixStore puts a "/" after the prefix)
            assert member.get("elastic//g1/members") == b"1,2"
        finally:
            member.close()
        # SIGTERM ends it cleanly
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
        assert server.returncode == 0, err
        assert "stopped (SIGTERM)" in err and "Traceback" not in err
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if server.poll() is None:
            server.kill()
            server.communicate()


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys) -> None:
    import socket

    key = tmp_path / "job.key"
    generate_keys(key)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["rendezvous", "--bind", f"tcp://127.0.0.1:{port}", "--key-file", str(key)]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphrun: error: --bind: cannot bind 'tcp://127.0.0.1:{port}'")
    assert err.count("\n") == 1
