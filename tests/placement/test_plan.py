from __future__ import annotations

import pytest
import yaml

from graphrun.errors import SpecError
from graphrun.names import RoleName
from graphrun.placement.job import Demand
from graphrun.placement.plan import (
    PlacementPlan,
    load_plan,
    make_plan,
    placement_of,
    plan_from_dict,
    write_plan,
)

ROLES = tuple(map(RoleName.parse, ("store:0", "trainer:0", "sampler:0:0", "ps:0")))
MACHINES = ("m0", "m1")


def test_plan_round_trip(tmp_path):
    plan = make_plan(MACHINES, ROLES, (0, 1, 1, 0))
    path = write_plan(plan, tmp_path / "plan.yaml", comments=["made by a test"])
    text = path.read_text()
    assert text.startswith("# made by a test\n")
    assert yaml.safe_load(text)["kind"] == "PlacementPlan"
    back = load_plan(path, machines=MACHINES, roles=ROLES, require_all=True)
    assert back == plan
    assert placement_of(back, MACHINES, ROLES) == (0, 1, 1, 0)
    assert back.roles_on("m1") == ["trainer:0", "sampler:0:0"]
    assert not list(tmp_path.glob(".*tmp*"))


def plan_dict(**kw):
    d = {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "PlacementPlan",
        "machines": ["m0", "m1"],
        "assignments": {"store:0": "m0", "store:0:1": "m0", "trainer:0": "m1"},
    }
    d.update(kw)
    return d


def test_backup_store_roles_are_valid():
    assert plan_from_dict(plan_dict()).machine_of(RoleName.store(0, 1)) == "m0"


@pytest.mark.parametrize(
    ("data", "kw", "field"),
    [
        (plan_dict(assignments={"trainer:0": "m9"}), {}, "machine 'm9' is not in machines"),
        (plan_dict(assignments={"worker:0": "m0"}), {}, "'worker:0' is not a role name"),
        (plan_dict(machines=["m0", "m0"]), {}, "listed twice"),
        (plan_dict(kind="Plan"), {}, "kind"),
        (plan_dict(), {"machines": ["m0"]}, "machines: 'm1' is not a machine of the cluster"),
        (plan_dict(), {"roles": ROLES[:2]}, r"assignments\.store:0:1: not a role"),
        (
            plan_dict(assignments={"store:0": "m0"}),
            {"roles": ROLES[:2], "require_all": True},
            r"assignments\.trainer:0: missing",
        ),
    ],
)
def test_bad_plans_name_the_field(tmp_path, data, kw, field):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=field) as exc:
        load_plan(path, **kw)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_plan_model_is_frozen():
    plan = PlacementPlan(machines=["m0"], assignments={"ps:0": "m0"})
    with pytest.raises(Exception, match="frozen"):
        plan.machines = ["m1"]  # type: ignore[misc]


def test_capacity_and_demands_round_trip(tmp_path):
    cap = {m: Demand(cpu=8, memory_gb=32) for m in MACHINES}
    dem = {"store:0": Demand(cpu=2, memory_gb=20), "trainer:0": Demand(cpu=4, memory_gb=8)}
    plan = make_plan(MACHINES, ROLES, (0, 1, 1, 0), capacity=cap, demands=dem)
    back = load_plan(write_plan(plan, tmp_path / "plan.yaml"))
    assert back == plan
    assert back.demand_on("m0") == Demand(cpu=2, memory_gb=20)  # ps:0 has no demand
    assert back.demand_on("m1") == Demand(cpu=4, memory_gb=8)
    # a plan without them is written as before: no empty keys
    bare = write_plan(make_plan(MACHINES, ROLES, (0, 1, 1, 0)), tmp_path / "bare.yaml")
    assert set(yaml.safe_load(bare.read_text())) == {
        "apiVersion",
        "kind",
        "machines",
        "assignments",
    }
    assert load_plan(bare).demand_on("m0") is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {
                "capacity": {"m0": {"cpu": 4, "memory_gb": 16}},
                "demands": {
                    "store:0": {"cpu": 2, "memory_gb": 10},
                    "store:0:1": {"cpu": 1, "memory_gb": 10},
                },
            },
            r"capacity\.m0\.memory_gb: the roles on m0 \(store:0, store:0:1\) need 20, "
            "the machine has 16",
        ),
        (
            {"capacity": {"m0": {"cpu": 1}}, "demands": {"store:0": {"cpu": 2}}},
            r"capacity\.m0\.cpu: the roles on m0 \(store:0\) need 2, the machine has 1",
        ),
        ({"capacity": {"m7": {"cpu": 1}}}, r"capacity\.m7: not in machines"),
        ({"demands": {"trainer:3": {"cpu": 1}}}, r"demands\.trainer:3: not in assignments"),
        ({"demands": {"store:0": {"cpu": -1}}}, r"demands\.store:0\.cpu: Input should be"),
        ({"capacity": {"m0": {"disk": 1}}}, r"capacity\.m0\.disk: Extra inputs"),
    ],
)
def test_plans_that_overfill_a_machine_are_refused(tmp_path, extra, message):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan_dict(**extra)))
    with pytest.raises(SpecError, match=f"^{path}: {message}") as exc:
        load_plan(path)
    assert "\n" not in str(exc.value)
