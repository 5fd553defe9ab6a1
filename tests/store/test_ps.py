"""Parameter servers: sharding, the server-side Adam, sync/async aggregation, the server."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import torch

from graphrun.errors import ArgumentError, AuthError, StoreError
from graphrun.placement.profile import PSRecord
from graphrun.rpc.auth import new_keypair
from graphrun.store.ps_client import PSClient, stop_parameter_servers
from graphrun.store.ps_server import PSConfig, run_ps
from graphrun.store.ps_state import AdamConfig, DenseAdam, ShardState, shard_params
from graphrun.wire import convert


def test_shards_are_balanced_by_bytes_and_deterministic():
    sizes = {"a.weight": 400, "a.bias": 4, "b.weight": 300, "b.bias": 4, "c.weight": 120}
    shards = shard_params(sizes, 2)
    assert shards == [["a.weight", "a.bias", "b.bias"], ["b.weight", "c.weight"]]  # 408, 420
    assert sorted(n for s in shards for n in s) == sorted(sizes)  # each exactly once
    assert shard_params(sizes, 2) == shards
    assert shard_params({"x": 8}, 3) == [["x"], [], []]  # more servers than parameters
    with pytest.raises(ArgumentError, match="servers"):
        shard_params(sizes, 0)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_dense_adam_equals_torch_adam(wd):
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=50).astype(np.float32)
    mine = p0.copy()
    opt = DenseAdam(AdamConfig(lr=0.01, weight_decay=wd), mine.size)
    ref = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    topt = torch.optim.Adam([ref], lr=0.01, weight_decay=wd)
    for _ in range(20):
        g = rng.normal(size=50).astype(np.float32)
        opt.apply(mine, g)
        ref.grad = torch.from_numpy(g.copy())
        topt.step()
    np.testing.assert_allclose(mine, ref.detach().numpy(), rtol=1e-5, atol=1e-6)


def shard(mode="sync", trainers=2, staleness=0, size=4) -> ShardState:
    param = np.ones(size, np.float32)
    return ShardState(("w",), ((size,),), param, DenseAdam(AdamConfig(lr=0.1), size),
                      trainers, mode, staleness)  # fmt: skip


def test_sync_applies_the_mean_once_every_trainer_pushed():
    s, ref = shard(), shard(trainers=1)
    g0, g1 = np.full(4, 1.0, np.float32), np.full(4, 3.0, np.float32)
    assert not s.push(0, 0, g0)
    assert not s.ready(1) and s.ready(0)
    assert s.push(1, 0, g1)
    assert s.ready(1) and s.clock == 1
    ref.push(0, 0, (g0 + g1) / 2)
    np.testing.assert_array_equal(s.param, ref.param)
    with pytest.raises(StoreError, match="expects its step 1"):
        s.push(0, 0, g0)  # a step already applied
    with pytest.raises(ArgumentError, match="rank 5"):
        s.push(5, 1, g0)


def test_async_applies_each_push_and_bounds_staleness():
    s = shard("async", staleness=2)
    g = np.ones(4, np.float32)
    for c in range(3):
        assert s.push(0, c, g)  # trainer 0 runs ahead; trainer 1 is at step 0
    assert s.ready(2) and not s.ready(3)  # step 3 may miss at most 2 steps of trainer 1
    s.push(1, 0, g)
    assert s.ready(3)
    assert s.opt.step == 4
    with pytest.raises(ArgumentError, match="staleness"):
        shard("sync", staleness=1)


def test_save_and_load_restore_the_shard_exactly():
    s = shard()
    s.push(0, 0, np.ones(4, np.float32))
    s.push(1, 0, np.ones(4, np.float32))
    body, arrays = s.save()
    t = shard()
    t.load(body["names"], body["step"], arrays)
    assert t.opt.step == 1 and t.clock == 0
    for a, b in zip(arrays, (t.param, t.opt.exp_avg, t.opt.exp_avg_sq), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ArgumentError, match="not this shard's"):
        t.load(["other"], 1, arrays)


@pytest.fixture
def servers(tmp_path):
    keys = new_keypair()
    stop = threading.Event()
    addresses: list[str] = []
    threads = []
    for j in range(2):
        ready = threading.Event()

        def on_ready(a: str, ready=ready) -> None:
            addresses.append(a)
            ready.set()

        cfg = PSConfig(j, "tcp://127.0.0.1:0", keys, tmp_path / f"ps-{j}.jsonl")
        t = threading.Thread(target=run_ps, args=(cfg, stop.is_set, on_ready), daemon=True)
        t.start()
        assert ready.wait(10)
        threads.append(t)
    yield addresses, keys, tmp_path
    stop.set()
    for t in threads:
        t.join(10)


def test_two_trainers_in_sync_get_what_one_optimizer_gives(servers):
    addresses, keys, profile_dir = servers
    shapes = {"a": (3, 2), "b": (5,), "c": (1,)}
    rng = np.random.default_rng(1)
    first = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    c0, c1 = (PSClient(addresses, shapes, keys, timeout=10) for _ in range(2))
    c0.init(first, 2, "sync", 0, AdamConfig(lr=0.05))
    refs = {n: torch.nn.Parameter(torch.from_numpy(v.copy())) for n, v in first.items()}
    topt = torch.optim.Adam(refs.values(), lr=0.05)
    for step in range(3):
        g0 = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
        g1 = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
        out: dict[int, dict] = {}
        t = threading.Thread(target=lambda s=step, g=g1, o=out: o.__setitem__(1, c1.step(1, s, g)))
        t.start()  # trainer 1's pull waits on the server until trainer 0 pushed too
        out[0] = c0.step(0, step, g0)
        t.join(10)
        for n in shapes:
            refs[n].grad = torch.from_numpy((g0[n] + g1[n]) / 2)
        topt.step()
        for n in shapes:
            np.testing.assert_array_equal(out[0][n], out[1][n])
            np.testing.assert_allclose(out[0][n], refs[n].detach().numpy(), rtol=1e-5, atol=1e-6)
    saved = c0.save()
    assert saved["step"] == [3, 3]
    c0.load(saved)
    np.testing.assert_array_equal(c1.pull(0)["a"], saved["params"]["a"])
    for c in (c0, c1):
        c.close()
    stop_parameter_servers(addresses, keys)
    # each server's profile line at stop: its CPU seconds for the 3 steps of 2 trainers
    # (the placement model's ps_update_s), written once it stopped
    paths = [profile_dir / f"ps-{j}.jsonl" for j in range(2)]
    deadline = time.monotonic() + 10
    while not all(p.exists() and p.read_text().endswith("\n") for p in paths):
        assert time.monotonic() < deadline, "the parameter servers wrote no profile line"
        time.sleep(0.05)
    for j, path in enumerate(paths):
        rec = convert(PSRecord, json.loads(path.read_text()), str(path))
        assert (rec.index, rec.pushes, rec.trainers) == (j, 6, 2) and rec.cpu_s > 0


def test_a_shard_larger_than_a_request_frame_is_refused_before_training():
    with pytest.raises(ArgumentError, match=r"raise runtime\.parameterServers"):
        PSClient(["tcp://127.0.0.1:1"], {"huge": (1 << 25,)}, None)  # 128 MiB of float32


def test_a_parameter_server_refuses_another_key(servers):
    addresses = servers[0]
    c = PSClient(addresses, {"a": (1,)}, new_keypair(), timeout=3)
    try:
        with pytest.raises(AuthError):
            c.pull(0)
    finally:
        c.close()


def test_graphrun_ps_refuses_bad_flags_in_one_line(capsys):
    from graphrun.cli import main

    assert main(["ps", "--index", "0"]) == 2
    assert "--key-file: give the job's key file" in capsys.readouterr().err
    assert main(["ps", "--index", "-1", "--insecure"]) == 2
    assert "argument --index: -1 is not in [0, 63]" in capsys.readouterr().err


def test_a_parked_pull_past_its_deadline_is_answered_with_an_error_and_forgotten(monkeypatch):
    from graphrun.rpc.codec import Message, MsgKind
    from graphrun.store import ps_server

    ps = ps_server.ParameterServer(0)
    sent: list[tuple[bytes, Message]] = []
    ps.reply = lambda peer, msg: sent.append((peer, msg))
    pull = Message(MsgKind.REQUEST, "ps_pull", 9, {"step": 3})
    assert ps.handle(b"peer", pull) is None  # parked: no ps_init yet
    ps.expire()
    assert sent == [] and len(ps.parked) == 1
    monkeypatch.setattr(ps_server, "PARK_S", -1.0)
    ps.parked.clear()
    assert ps.handle(b"peer", pull) is None
    ps.expire()
    ((peer, msg),) = sent
    assert (peer, msg.kind, msg.request_id, ps.parked) == (b"peer", MsgKind.ERROR, 9, [])
    assert "not ready within" in msg.body["message"]


INIT = {"names": ["w", "b"], "shapes": [[2, 2], [2]], "trainers": 2, "staleness": 0}


@pytest.mark.parametrize(
    ("op", "body", "says"),
    [
        ("ps_init", {**INIT, "names": "w"}, "names: Expected `array`, got `str`"),
        ("ps_init", {**INIT, "shapes": [[2, 2]]}, "shapes: 1 for 2 names"),
        ("ps_init", {**INIT, "shapes": [[2, True], [2]]}, "shapes[0][1]: Expected `int`"),
        ("ps_init", {**INIT, "shapes": [[-1, 2], [2]]}, "shapes[0][0]: Expected `int` >= 0"),
        ("ps_init", {**INIT, "shapes": [[1] * 40, [2]]}, "shapes[0]: Expected `array` of length"),
        ("ps_init", {**INIT, "mode": "lazy"}, "mode: Invalid enum value 'lazy'"),
        ("ps_init", {**INIT, "optimizer": {"momentum": 0.9}}, "optimizer: unknown keys"),
        ("ps_init", {k: v for k, v in INIT.items() if k != "trainers"}, "trainers: missing"),
        ("ps_push", {"rank": 0, "clock": "1"}, "clock: Expected `int`, got `str`"),
        ("ps_pull", {"step": -1}, "step: Expected `int` >= 0"),
        ("ps_load", {"names": ["w"], "step": 1 << 63}, "step: Expected `int` <= "),
    ],
)  # fmt: skip
def test_a_malformed_request_body_is_one_line_naming_its_field(op, body, says):
    from graphrun.rpc.codec import Message, MsgKind
    from graphrun.store import ps_server

    ps = ps_server.ParameterServer(0)
    if op in ("ps_push", "ps_load"):
        init = Message(MsgKind.REQUEST, "ps_init", 1, INIT, (np.zeros(6, np.float32),))
        ps.handle(b"peer", init)
    with pytest.raises(ArgumentError) as exc:
        ps.handle(b"peer", Message(MsgKind.REQUEST, op, 2, body, (np.zeros(6, np.float32),)))
    assert str(exc.value).startswith(f"{op}: {says}"), str(exc.value)
