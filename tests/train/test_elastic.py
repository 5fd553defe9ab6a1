"""The pure parts of elastic trainers (the re-form itself runs in tests/train/test_elastic_group.py
and, whole jobs, in tests/local/test_elastic.py)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from graphrun.errors import RpcTimeout
from graphrun.testing.jobs import wait_for
from graphrun.train.elastic import agree_members, peer_lost, plan_rest, remaining


def test_peer_lost_tells_a_lost_peer_from_other_errors():
    gloo = "[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"
    assert peer_lost(RuntimeError(gloo))
    assert peer_lost(RuntimeError("[Rank 1]: Timed out waiting 30000ms for recv operation"))
    assert not peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not peer_lost(ValueError("Connection reset"))
    assert not peer_lost(RpcTimeout("no answer within 5 s", address="tcp://x:1", kind="pull"))


def test_the_rest_of_an_epoch_is_every_trainers_batches_from_the_step_on():
    orders = [torch.arange(0, 10), torch.arange(10, 20), torch.arange(20, 30)]
    rest = remaining(orders, 2, 3)  # 2 steps of 3 seeds taken by each of the 3 trainers
    assert rest.tolist() == [6, 7, 8, 9, 16, 17, 18, 19, 26, 27, 28, 29]
    plan = plan_rest(rest, 2, lambda ids, r, w: ids[r::w], 7, 1)
    assert sorted(torch.cat(plan).tolist()) == rest.tolist()
    assert [len(p) for p in plan] == [6, 6]
    assert remaining(orders, 4, 3).numel() == 0


def test_the_rest_of_an_epoch_is_trained_shuffled_not_in_node_id_order():
    # node_split sorts the ids it deals: a share trained in that order is, on a graph
    # whose ids follow its communities, one class after another (issue 40, item 7b)
    rest = torch.randperm(2000, generator=torch.Generator().manual_seed(0))

    def split(ids: torch.Tensor, r: int, w: int) -> torch.Tensor:
        return ids.sort().values[r::w]

    plan = plan_rest(rest, 2, split, 7, 1)
    for share, dealt in zip(plan, [split(rest, r, 2) for r in range(2)], strict=True):
        assert sorted(share.tolist()) == dealt.tolist()  # the same seeds
        assert not torch.equal(share, dealt)  # in a shuffled order
        first = share[:100]  # the first batches reach over the whole id range
        assert first.max() - first.min() > 1500
    assert all(
        torch.equal(a, b) for a, b in zip(plan, plan_rest(rest, 2, split, 7, 1), strict=True)
    )


def _agree(path: str, ident: int, last: list[int], settle_s: float, out: dict) -> None:
    store = dist.FileStore(path, -1)
    store.set_timeout(timedelta(seconds=10))
    out[ident] = agree_members(store, 1, ident, last, settle_s, 10.0)


@pytest.mark.parametrize("present", [[0, 2], [1, 2], [0, 1, 2]])
def test_the_survivors_agree_on_one_member_list(tmp_path, present):
    out: dict[int, list[int]] = {}
    threads = [
        threading.Thread(target=_agree, args=(str(tmp_path / "g1"), r, [0, 1, 2], 0.5, out))
        for r in present
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {r: present for r in present}


def test_a_trainer_that_comes_too_late_is_left_out(tmp_path):
    out: dict[int, list[int]] = {}
    path = str(tmp_path / "g1")
    _agree(path, 0, [0, 1, 2], 0.2, out)  # alone for the settle time: fixes [0]
    _agree(path, 2, [0, 1, 2], 0.2, out)
    assert out == {0: [0], 2: [0]}


def test_a_late_survivor_is_waited_for_when_the_others_are_too_few(tmp_path):
    """On 3 netns machines with m1 killed, trainer 2 noticed the loss more than the settle
    time after trainer 0 (it was sampling, not in a collective): trainer 0 fixed [0] and
    stopped the job below minMachines 2. Too few present after the settle time: wait on."""
    out: dict[int, list[int]] = {}
    store = dist.FileStore(str(tmp_path / "g1"), -1)
    store.set_timeout(timedelta(seconds=10))

    def enough(members: list[int]) -> bool:
        return len(members) >= 2

    first = threading.Thread(
        target=lambda: out.update({0: agree_members(store, 1, 0, [0, 1, 2], 0.2, 10.0, enough)})
    )
    first.start()
    time.sleep(1.0)  # five settle times later
    out[2] = agree_members(dist.FileStore(str(tmp_path / "g1"), -1), 1, 2, [0, 1, 2], 0.2, 10.0)
    first.join(30)
    assert out == {0: [0, 2], 2: [0, 2]}
    # never enough: it gives up after timeout_s (the job then restarts from its checkpoint)
    lone = dist.FileStore(str(tmp_path / "g2"), -1)
    assert agree_members(lone, 1, 0, [0, 1], 0.1, 0.5, enough) == [0]


def test_a_survivor_takes_the_member_list_fixed_meanwhile(tmp_path):
    """A survivor whose collective timed out (settle time: the collective timeout) came to
    the re-form after the others had fixed the members: it waited its whole settle time
    anyway (60 s of a 120 s pause) while the others waited for it in the new group."""
    store = dist.FileStore(str(tmp_path / "g1"), -1)
    store.set_timeout(timedelta(seconds=10))
    store.set("g1/in/0", b"3")  # trainer 0, as it left it: present, members fixed
    store.set("g1/members", b"0,2")
    t0 = time.monotonic()
    assert agree_members(store, 1, 2, [0, 1, 2], 30.0, 60.0) == [0, 2]
    assert time.monotonic() - t0 < 10  # a hang detector: it waited 30 s (settle_s)


def test_the_longest_settle_time_asked_by_those_present_is_waited(tmp_path):
    """A survivor that saw only a connection close (the first one shut its connections)
    waits as long as one that saw a collective time out asks: a slow but living trainer
    gets that long to come."""
    store = dist.FileStore(str(tmp_path / "g1"), -1)
    store.set_timeout(timedelta(seconds=10))
    store.set("g1/in/2", b"6")  # trainer 2 timed out: it asks for 6 s

    def late() -> None:
        time.sleep(1.0)
        dist.FileStore(str(tmp_path / "g1"), -1).set("g1/in/1", b"6")

    slow = threading.Thread(target=late)
    slow.start()
    # trainer 0 saw a connection close: 0.2 s of its own, 2 machines present are enough
    members = agree_members(store, 1, 0, [0, 1, 2], 0.2, 10.0, lambda m: len(m) >= 2)
    slow.join(30)
    assert members == [0, 1, 2]


def test_a_trainer_that_reaches_too_few_machines_is_the_one_cut_off():
    """On netns hosts a machine whose link is down still reaches the rendezvous file: its
    trainer joined the re-form, the others found nobody gone, and every trainer failed.
    Before it joins, a trainer probes a store server of each other machine."""
    import socket

    from graphrun.errors import CutOff
    from graphrun.names import Endpoint
    from graphrun.train.config import ElasticConfig
    from graphrun.train.ddp import DDPConfig
    from graphrun.train.elastic import Regroup, reachable

    up = socket.create_server(("127.0.0.1", 0))
    down = socket.create_server(("127.0.0.1", 0))
    live, dead = (Endpoint("127.0.0.1", s.getsockname()[1]) for s in (up, down))
    down.close()  # nothing listens there: refused
    try:
        probes = {"m0": live, "m1": dead, "m2": dead}
        assert reachable(probes, ["m0", "m1", "m3"]) == {"m0", "m3"}  # m3: no probe
        ddp = DDPConfig(1, 3, "file:///nonexistent")
        machines = ("m0", "m1", "m2")

        def regroup(probes: dict[str, Endpoint], min_machines: int) -> Regroup:
            cfg = ElasticConfig(min_machines, timeout_s=1.0, probes=tuple(probes.items()))
            return Regroup(ddp, cfg, machines)

        regroup({"m0": live, "m2": dead}, 2).check_not_cut_off()  # reaches m0: 2 machines
        with pytest.raises(CutOff, match="trainer 1 on m1: reaches 0 of the other machines"):
            regroup({"m0": dead, "m2": dead}, 2).check_not_cut_off()
        with pytest.raises(CutOff, match="cut off"):
            regroup({"m0": live, "m2": dead}, 3).check_not_cut_off()
        regroup({}, 3).check_not_cut_off()  # nothing to probe: nothing tells
    finally:
        up.close()


def _regroup(rdv: str, ident: int, world: int, joining: bool = False, timeout_s: float = 10.0):
    from graphrun.train.config import ElasticConfig
    from graphrun.train.ddp import DDPConfig
    from graphrun.train.elastic import Regroup

    ddp = DDPConfig(ident, world, rdv, timeout_s=timeout_s)
    machines = tuple(f"m{r}" for r in range(world))
    return Regroup(ddp, ElasticConfig(min_machines=1), machines, None, joining=joining)


def test_a_joiner_is_let_in_at_an_epoch_boundary_after_the_members(tmp_path):
    """The join door over a real FileStore: trainer 1 of 3 was lost (the group is 0, 2 in
    generation 1) and comes back; rank 0 sees its request at the next boundary, fixes
    generation 2 as the members then the joiner (rank 0 stays rank 0) and answers it."""
    rdv = f"file://{tmp_path / 'rdv'}"
    lead = _regroup(rdv, 0, 3)
    lead.members, lead.generation = (0, 2), 1
    other = _regroup(rdv, 2, 3)
    other.members, other.generation = (0, 2), 1
    lead.ddp = type(lead.ddp)(0, 2, rdv, timeout_s=10.0)
    other.ddp = type(lead.ddp)(1, 2, rdv, timeout_s=10.0)
    assert lead.pending(epoch=2) == {}  # nobody asked yet
    joiner = _regroup(rdv, 1, 3, joining=True)
    got: dict[str, object] = {}
    t = threading.Thread(target=lambda: got.update(answer=joiner.admission()))
    t.start()
    assert wait_for(lambda: lead.pending(epoch=2) != {}, 20.0)
    asked = lead.pending(epoch=2)
    assert list(asked) == [1] and 0 < time.time() - asked[1] < 30
    gen, _ = lead.admit(sorted(asked), epoch=2)
    gen_other, _ = other.admit(sorted(asked), epoch=2)
    t.join(30)
    assert gen == gen_other == 2
    assert lead.members == other.members == (0, 2, 1)  # the joiner last: new rank 2
    answer = got["answer"]
    assert isinstance(answer, tuple) and answer[:2] == (2, 2)  # generation 2, from epoch 2
    assert joiner.members == (0, 2, 1) and joiner.generation == 2
    assert lead.pending(epoch=3) == {}  # answered: the request is gone


def test_a_joiner_ends_at_once_when_the_trainers_finished(tmp_path):
    rdv = f"file://{tmp_path / 'rdv'}"
    _regroup(rdv, 0, 2).close_door()
    joiner = _regroup(rdv, 1, 2, joining=True)
    assert joiner.admission() is None
    # an answer left from an earlier admission is not taken for a new one
    again = _regroup(rdv, 1, 2, joining=True)
    again.door().set("ans/1", b"1,1,an-earlier-token")
    assert again.admission() is None


def test_a_joiner_told_to_stop_takes_its_request_back(tmp_path):
    rdv = f"file://{tmp_path / 'rdv'}"
    lead = _regroup(rdv, 0, 2)
    lead.members = (0,)
    assert _regroup(rdv, 1, 2, joining=True).admission(lambda: True) is None
    assert lead.pending(epoch=1) == {}


def test_a_joiner_gives_up_when_no_boundary_passes(tmp_path):
    from graphrun.errors import GraphrunError

    joiner = _regroup(f"file://{tmp_path / 'rdv'}", 1, 2, joining=True, timeout_s=0.5)
    with pytest.raises(GraphrunError, match=r"passed no epoch boundary in 0\.5s"):
        joiner.admission()


def test_the_join_door_on_the_jobs_curve_store():
    """With a TCP rendezvous (Kubernetes) joiners ask at trainer 0's CURVE store."""
    from graphrun.rpc.auth import new_keypair
    from graphrun.train.config import ElasticConfig
    from graphrun.train.ddp import DDPConfig
    from graphrun.train.elastic import Regroup
    from graphrun.train.rendezvous import KeyStore, RendezvousServer

    keys = new_keypair()
    server = RendezvousServer("tcp://127.0.0.1:*", keys)
    stores = [KeyStore(server.endpoint, keys, timeout_s=10) for _ in range(2)]
    try:
        cfg, machines = ElasticConfig(min_machines=1), ("m0", "m1")
        lead = Regroup(DDPConfig(0, 2, "127.0.0.1:1", timeout_s=10), cfg, machines, stores[0])
        lead.members = (0,)
        joiner = Regroup(
            DDPConfig(1, 2, "127.0.0.1:1", timeout_s=10), cfg, machines, stores[1], joining=True
        )
        got: dict[str, object] = {}
        t = threading.Thread(target=lambda: got.update(answer=joiner.admission()))
        t.start()
        assert wait_for(lambda: lead.pending(epoch=3) != {}, 20.0)
        lead.ddp = DDPConfig(0, 1, "127.0.0.1:1", timeout_s=10)
        assert lead.admit([1], epoch=3)[0] == 1
        t.join(30)
        answer = got["answer"]
        assert isinstance(answer, tuple) and answer[:2] == (1, 3)
        assert joiner.members == (0, 1) and lead.pending(epoch=4) == {}
        lead.close_door()
        assert (
            Regroup(
                DDPConfig(1, 2, "127.0.0.1:1", timeout_s=10), cfg, machines, stores[1], joining=True
            ).admission()
            is None
        )
    finally:
        for s in stores:
            s.close()
        server.close()
