"""The one rule both backends ask when an elastic job loses a machine."""

from __future__ import annotations

from graphrun.job.elastic import may_rejoin, took_over, why_not_survived
from graphrun.job.spec.runtime import ElasticSpec
from graphrun.names import RoleName
from graphrun.record import TookOver

# 3 machines, 3 partitions, a replica each on the next machine
STORES = {
    RoleName.parse(role): machine
    for role, machine in [
        ("store:0", "m0"), ("store:0:r", "m1"),
        ("store:1", "m1"), ("store:1:r", "m2"),
        ("store:2", "m2"), ("store:2:r", "m0"),
    ]
}  # fmt: skip


def test_a_loss_is_survived_while_min_machines_are_left_and_every_partition_has_a_copy():
    two = ElasticSpec(min_machines=2)
    assert why_not_survived(two, "m1", 3, 0, STORES) is None
    assert why_not_survived(two, "m2", 3, 1, STORES, ["m1"]) == (
        "partition 1 would have no copy left"
    )
    one = ElasticSpec(min_machines=1)
    assert why_not_survived(one, "m0", 3, 1, STORES, ["m1"]) == (
        "partition 0 would have no copy left"  # its primary on m0, its replica on m1
    )
    assert why_not_survived(ElasticSpec(min_machines=3), "m1", 3, 0, STORES) == (
        "2 machines would be left, fewer than runtime.elastic.minMachines"
    )
    assert why_not_survived(None, "m1", 3, 0, STORES) == "runtime.elastic is not set"


def test_a_loss_while_another_machine_starts_fails_the_attempt():
    # m0 still waits for every store server, m1's too: it would wait out its timeout
    two = ElasticSpec(min_machines=2)
    assert why_not_survived(two, "m1", 3, 0, STORES, starting=["m0"]) == (
        "m0 was still starting (it waits for every store server)"
    )
    assert why_not_survived(two, "m1", 3, 0, STORES, starting=["m1"]) is None  # itself


def test_a_machine_back_counts_as_gone_for_its_stores():
    # m1 lost and back (lost 0 now) still has no store servers
    one = ElasticSpec(min_machines=1)
    assert why_not_survived(one, "m2", 3, 0, STORES, stores_gone=["m1"]) is not None
    assert why_not_survived(one, "m2", 3, 0, STORES) is None


def test_what_took_over_names_live_replicas_and_the_trainers_not_away():
    trainers = ["m0", "m1", "m2"]
    assert took_over(STORES, trainers, "m1", ["m1"], ["m1"]) == TookOver(
        {"partition 1": "store:1:r on m2"}, ["m0", "m2"]
    )
    # m2 was lost and is back: its trainers go on, its store servers do not serve
    assert took_over(STORES, trainers, "m1", ["m1", "m2"], ["m1"]) == TookOver({}, ["m0", "m2"])
    assert took_over(STORES, trainers, "m0", ["m0"], ["m0"]).partitions == {
        "partition 0": "store:0:r on m1"
    }


def test_a_lost_machine_rejoins_max_rejoins_times():
    assert [may_rejoin(ElasticSpec(min_machines=1, max_rejoins=2), n) for n in range(3)] == [
        True, True, False,
    ]  # fmt: skip
    assert not may_rejoin(ElasticSpec(min_machines=1, max_rejoins=0), 0)
    assert not may_rejoin(None, 0)
