from __future__ import annotations

import pytest
import yaml

from graphrun.errors import SpecError
from graphrun.placement.plan import (
    PlacementPlan,
    load_plan,
    make_plan,
    placement_of,
    plan_from_dict,
    write_plan,
)

ROLES = ("store:0", "trainer:0", "sampler:0:0", "ps:0")
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
    assert plan_from_dict(plan_dict()).machine_of("store:0:1") == "m0"


@pytest.mark.parametrize(
    ("data", "kw", "field"),
    [
        (plan_dict(assignments={"trainer:0": "m9"}), {}, "machine 'm9' is not in machines"),
        (plan_dict(assignments={"worker:0": "m0"}), {}, "'worker:0' is not a role name"),
        (plan_dict(machines=["m0", "m0"]), {}, "listed twice"),
        (plan_dict(kind="Plan"), {}, "kind"),
        (plan_dict(), {"machines": ["m0"]}, "machines: 'm1' is not a machine of the cluster"),
        (plan_dict(), {"roles": ["store:0", "trainer:0"]}, r"assignments\.store:0:1: not a role"),
        (
            plan_dict(assignments={"store:0": "m0"}),
            {"roles": ["store:0", "trainer:0"], "require_all": True},
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
