from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from graphrun.errors import SpecError, UserError
from graphrun.job.spec import (
    GraphJob,
    graphjob_json_schema,
    job_roles,
    load_job,
    loads_job,
    parse_job,
    resolve_placement,
)
from graphrun.names import RoleName

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"

MINIMAL = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "GraphJob",
    "metadata": {"name": "j"},
    "spec": {"graph": {"dataset": "data"}, "training": {"task": "node-classification"}},
}


def job(**spec: Any) -> dict[str, Any]:
    d = copy.deepcopy(MINIMAL)
    d["spec"].update(spec)
    return d


def error_of(data: Any) -> str:
    with pytest.raises(SpecError) as info:
        parse_job(data, "job.yaml")
    return str(info.value)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    j = load_job(path)
    assert j.kind == "GraphJob"
    placement = resolve_placement(j, path.parent)
    assert set(placement.values()) <= set(j.spec.machine_names)


def test_defaults_and_snake_case() -> None:
    j = parse_job(MINIMAL)
    assert j.spec.runtime.machines == 1
    assert j.spec.runtime.trainers_per_machine == 1
    assert j.spec.partition.algorithm == "metis" and j.spec.partition.mode == "single"
    assert j.spec.training.fanouts == [25, 10]
    assert j.spec.run_policy.clean_pod_policy == "Running"
    assert j.spec.num_parts == 1
    assert j.partition_dir() == "j-parts"


def test_camel_case_keys() -> None:
    j = parse_job(job(runtime={"machines": 3, "trainersPerMachine": 2}, partition={"parts": 3}))
    assert j.spec.runtime.trainers_per_machine == 2
    assert j.spec.num_trainers == 6
    assert j.spec.machine_names == ["m0", "m1", "m2"]


def test_round_trip_through_yaml() -> None:
    j = load_job(EXAMPLES / "graphsage.yaml")
    again = loads_job(yaml.safe_dump(j.to_dict()))
    assert again == j
    assert "trainersPerMachine" in yaml.safe_dump(j.model_dump(by_alias=True, exclude_none=True))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            job(runtime={"trainersPerMachine": 0}),
            "job.yaml: spec.runtime.trainersPerMachine: Input should be greater than 0",
        ),
        (job(runtime={"machinez": 2}), "spec.runtime.machinez: Extra inputs are not permitted"),
        (
            job(training={"task": "node-classification", "fanouts": [10, -2]}),
            "spec.training.fanouts[1]: Input should be greater than or equal to -1",
        ),
        (
            job(training={"task": "node-classification", "model": "banana"}),
            "spec.training.model: 'banana' is not a model of node-classification "
            "(known: sage, gcn, gat)",
        ),
        (
            job(training={"task": "hetero-node-classification", "model": "gat"}),
            "spec.training.model: 'gat' is not a model of hetero-node-classification "
            "(known: rgcn, hetero-sage)",
        ),
        (
            job(training={"task": "node-classification", "script": "t.py"}),
            "spec.training: give exactly one of task, entryPoint, script",
        ),
        (job(training={"args": []}), "spec.training: give exactly one of"),
        (
            job(training={"entryPoint": "no-colon"}),
            "spec.training.entryPoint: String should match pattern",
        ),
        (job(graph={}), "spec.graph: give exactly one of dataset, generator"),
        (
            job(graph={"generator": {"name": "erdos"}}),
            "spec.graph.generator.name: Input should be 'community' or 'academic'",
        ),
        (
            job(partition={"method": "spectral"}),
            "spec.partition.method: Input should be 'metis', 'random' or 'kaminpar'",
        ),
        (
            job(partition={"mode": "distributed", "method": "metis"}),
            "spec.partition.method: 'metis' runs on one machine; mode 'distributed'",
        ),
        (
            job(partition={"mode": "distributed", "parts": 4}, runtime={"machines": 2}),
            "spec.partition.parts: 4 must equal runtime.machines (2) in mode 'distributed'",
        ),
        (
            job(partition={"mode": "parallel", "method": "metis"}),
            "spec.partition.method: 'metis' runs in one process; mode 'parallel' uses kaminpar",
        ),
        (
            job(partition={"parts": 4}, runtime={"machines": 2}),
            "spec.partition.parts: 4 must equal runtime.machines (2)",
        ),
        (
            job(runtime={"machines": 2, "machineNames": ["a"]}),
            "spec.runtime.machineNames: has 1 names for 2 machines",
        ),
        (job(training={"task": "node-classification", "lr": float("inf")}), "training.lr"),
        (job(training={"task": "node-classification", "lr": float("nan")}), "training.lr"),
        (
            job(graph={"dataset": "d", "store": {"addresses": ["tcp://h:1"], "keyFile": "k"}}),
            "spec.graph: give exactly one of dataset, generator, store",
        ),
        (
            job(graph={"store": {"addresses": ["tcp://h:1"]}}),
            "spec.graph.store: give keyFile (graphrun run) or keySecret",
        ),
        (
            job(graph={"store": {"addresses": ["h:1"], "keyFile": "k"}}),
            "spec.graph.store.addresses[0]: String should match pattern",
        ),
        (
            job(graph={"store": {"addresses": ["tcp://h:70000"], "keyFile": "k"}}),
            "spec.graph.store.addresses[0]: 'tcp://h:70000' is not host:port",
        ),
        (
            job(graph={"store": {"addresses": ["tcp://a]:[b:7000"], "keyFile": "k"}}),
            "spec.graph.store.addresses[0]: String should match pattern",
        ),
        (
            job(
                graph={"store": {"addresses": ["tcp://h:1"], "keyFile": "k"}},
                partition={"parts": 2},
            ),
            "spec.partition.parts: 2, but graph.store has 1 partitions",
        ),
        (job(runtime={"hosts": "ssh"}), "spec.runtime.hosts: Input should be 'local' or 'netns'"),
        (
            job(placement={"assignments": {"trainr:0": "m0"}}),
            "spec.placement.assignments: 'trainr:0' is not a role name",
        ),
        (  # the main server is store:0: one spelling per role, refused up front
            job(placement={"assignments": {"store:0:0": "m0"}}),
            "spec.placement.assignments: 'store:0:0' is not a role name",
        ),
        (
            job(placement={"assignments": {"trainer:01": "m0"}}),
            "spec.placement.assignments: 'trainer:01' is not a role name",
        ),
        (
            job(placement={"assignments": {}, "planFile": "p.yaml"}),
            "spec.placement: give at most one of assignments, planFile",
        ),
        (
            job(runPolicy={"cleanPodPolicy": "Some"}),
            "spec.runPolicy.cleanPodPolicy: Input should be 'Running', 'All' or 'None'",
        ),
        (job(runPolicy={"backoffLimit": -1}), "spec.runPolicy.backoffLimit: Input should be"),
        ({**MINIMAL, "apiVersion": "v1"}, "apiVersion: Input should be 'graphrun.io/v1alpha1'"),
        ({**MINIMAL, "kind": "Job"}, "kind: Input should be 'GraphJob'"),
        ({**MINIMAL, "metadata": {"name": "Bad_Name"}}, "metadata.name: String should match"),
        ({"kind": "GraphJob"}, "apiVersion: Field required; metadata: Field required"),
        ([1, 2], "job.yaml: expected a mapping"),
    ],
)
def test_field_level_errors(data: Any, expected: str) -> None:
    msg = error_of(data)
    assert expected in msg
    assert "\n" not in msg
    assert msg.startswith("job.yaml: ")


def test_spec_error_is_user_error() -> None:
    assert issubclass(SpecError, UserError)


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(SpecError, match=r"job.yaml: not valid YAML \(line"):
        load_job(bad)
    with pytest.raises(SpecError, match=r"nope\.yaml: cannot read job spec"):
        load_job(tmp_path / "nope.yaml")


def test_frozen() -> None:
    j = parse_job(MINIMAL)
    with pytest.raises(Exception, match="frozen"):
        j.spec.runtime.machines = 3  # type: ignore[misc]


def test_kubernetes_metadata_fields_are_ignored() -> None:
    d = copy.deepcopy(MINIMAL)
    d["metadata"].update(uid="123", resourceVersion="7", namespace="ml")
    assert parse_job(d).metadata.namespace == "ml"


def test_json_schema() -> None:
    schema = graphjob_json_schema()
    spec = schema["$defs"]["GraphJobSpec"]["properties"]
    assert {"graph", "partition", "runtime", "training", "runPolicy", "replicaSpecs"} <= set(spec)
    runtime = schema["$defs"]["RuntimeSpec"]["properties"]
    assert runtime["trainersPerMachine"]["exclusiveMinimum"] == 0
    replica = schema["$defs"]["ReplicaSpec"]["properties"]["template"]
    assert replica["x-kubernetes-preserve-unknown-fields"] is True
    assert set(schema["required"]) == {"apiVersion", "kind", "metadata", "spec"}


def test_replica_templates_are_free_form() -> None:
    tpl = {"spec": {"containers": [{"name": "graphrun", "image": "x", "anything": {"a": 1}}]}}
    j = parse_job(job(replicaSpecs={"worker": {"template": tpl}}))
    assert j.spec.replica_specs.worker is not None
    assert j.spec.replica_specs.worker.template == tpl


def test_roles_co_located() -> None:
    j = parse_job(
        job(
            runtime={
                "machines": 2,
                "storeServersPerMachine": 2,
                "trainersPerMachine": 2,
                "samplerWorkersPerTrainer": 1,
            }
        )
    )
    roles = {r.name: r.machine for r in job_roles(j.spec)}
    assert roles == {
        "store:0": "m0",
        "store:0:1": "m0",
        "store:1": "m1",
        "store:1:1": "m1",
        "trainer:0": "m0",
        "sampler:0:0": "m0",
        "trainer:1": "m0",
        "sampler:1:0": "m0",
        "trainer:2": "m1",
        "sampler:2:0": "m1",
        "trainer:3": "m1",
        "sampler:3:0": "m1",
    }
    first_trainer = [r.kind for r in job_roles(j.spec)].index("trainer")
    assert all(r.kind == "store" for r in job_roles(j.spec)[:first_trainer])


def test_roles_with_machine_names() -> None:
    j = parse_job(job(runtime={"machines": 2, "machineNames": ["a", "b"]}))
    assert [(r.name, r.machine) for r in job_roles(j.spec)] == [
        ("store:0", "a"),
        ("store:1", "b"),
        ("trainer:0", "a"),
        ("trainer:1", "b"),
    ]


def test_inline_assignments_override_defaults() -> None:
    j = parse_job(job(runtime={"machines": 2}, placement={"assignments": {"trainer:0": "m1"}}))
    assert resolve_placement(j)[RoleName.parse("trainer:0")] == "m1"
    assert resolve_placement(j)[RoleName.parse("trainer:1")] == "m1"


@pytest.mark.parametrize(
    ("assignments", "expected"),
    [
        ({"trainer:9": "m0"}, "spec.placement.assignments.trainer:9: the job has no such role"),
        ({"trainer:0": "m7"}, "spec.placement.assignments.trainer:0: unknown machine 'm7'"),
    ],
)
def test_bad_assignments(assignments: dict[str, str], expected: str) -> None:
    j = parse_job(job(runtime={"machines": 2}, placement={"assignments": assignments}))
    with pytest.raises(SpecError, match="^" + expected.replace("(", r"\(")):
        resolve_placement(j)


def test_parts_may_differ_from_machines_with_a_plan() -> None:
    j = parse_job(
        job(
            runtime={"machines": 2},
            partition={"parts": 4},
            placement={"assignments": {"store:2": "m1"}},
        )
    )
    placement = resolve_placement(j)
    assert [k for k in placement if k.kind == "store"] == [RoleName.store(i) for i in range(4)]
    assert placement[RoleName.parse("store:2")] == "m1"


def _write_plan(
    path: Path, machines: list[str], assignments: dict[str, str], **extra: object
) -> None:
    plan = {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "PlacementPlan",
        "machines": machines,
        "assignments": assignments,
        **extra,
    }
    path.write_text(yaml.safe_dump(plan))


def test_plan_file(tmp_path: Path) -> None:
    _write_plan(tmp_path / "plan.yaml", ["h0", "h1"], {"trainer:0": "h1", "ps:0": "h0"})
    j = parse_job(job(runtime={"machines": 2}, placement={"planFile": "plan.yaml"}))
    with pytest.raises(SpecError, match=r"plan\.yaml: assignments\.ps:0: the plan places a "):
        resolve_placement(j, tmp_path)  # an allreduce job has no parameter server to place
    training = {**MINIMAL["spec"]["training"], "sync": "ps"}
    j = parse_job(job(runtime={"machines": 2}, placement={"planFile": "plan.yaml"},
                      training=training))  # fmt: skip
    placement = resolve_placement(j, tmp_path)
    assert (
        placement[RoleName.parse("trainer:0")] == "m1"
    )  # plan machines map to job machines by position
    assert placement[RoleName.parse("ps:0")] == "m0"


def test_plan_file_errors(tmp_path: Path) -> None:
    j = parse_job(job(runtime={"machines": 2}, placement={"planFile": "plan.yaml"}))
    with pytest.raises(SpecError, match=r"plan\.yaml: cannot read"):
        resolve_placement(j, tmp_path)
    _write_plan(tmp_path / "plan.yaml", ["h0"], {})
    with pytest.raises(SpecError, match="machines: plan has 1 machines, the job has 2"):
        resolve_placement(j, tmp_path)
    _write_plan(tmp_path / "plan.yaml", ["h0", "h1"], {"trainer:0": "h9"})
    with pytest.raises(
        SpecError, match=r"plan\.yaml: assignments.trainer:0: machine 'h9' is not in"
    ):
        resolve_placement(j, tmp_path)
    _write_plan(tmp_path / "plan.yaml", ["h0", "h1"], {"trainer:0": "h1"}, score=1.5)
    with pytest.raises(SpecError, match=r"plan\.yaml: score: Extra inputs are not permitted"):
        resolve_placement(j, tmp_path)
    (tmp_path / "plan.yaml").write_text("kind: GraphJob\n")
    with pytest.raises(SpecError, match=r"plan\.yaml: kind: Input should be 'PlacementPlan'"):
        resolve_placement(j, tmp_path)
    (tmp_path / "plan.yaml").write_text("[m0, m1]\n")
    with pytest.raises(SpecError, match=r"plan\.yaml: expected a mapping"):
        resolve_placement(j, tmp_path)
    _write_plan(
        tmp_path / "plan.yaml",
        ["h0", "h1"],
        {"trainer:0": "h1", "trainer:1": "h1"},
        capacity={"h1": {"cpu": 4, "memory_gb": 16}},
        demands={"trainer:0": {"cpu": 4}, "trainer:1": {"cpu": 1}},
    )
    with pytest.raises(
        SpecError,
        match=r"^\S*plan\.yaml: capacity\.h1\.cpu: the roles on h1 \(trainer:0, trainer:1\) "
        r"need 5, the machine has 4$",
    ):
        resolve_placement(j, tmp_path)


def test_graphjob_is_the_model() -> None:
    assert isinstance(parse_job(MINIMAL), GraphJob)


def _inline(machines: list[str], roles: dict[str, str], **more: Any) -> dict[str, Any]:
    return job(
        runtime={"machines": 2, "trainersPerMachine": 2},
        placement={"plan": {"machines": machines, "assignments": roles}, **more},
    )


def test_inline_plan_maps_plan_machines_to_job_machines_by_position() -> None:
    plan = {"store:0": "node-b", "store:1": "node-b", "trainer:0": "node-a", "ps:0": "node-a"}
    data = _inline(["node-a", "node-b"], plan, nodeLabel="graphrun.io/machine")
    data["spec"]["training"] = {**data["spec"]["training"], "sync": "ps"}
    j = parse_job(data)
    placement = resolve_placement(j)
    assert placement[RoleName.parse("store:0")] == placement[RoleName.parse("store:1")] == "m1"
    assert placement[RoleName.parse("trainer:0")] == "m0"
    assert placement[RoleName.parse("trainer:3")] == "m1"  # left out: its co-located machine
    assert placement[RoleName.parse("ps:0")] == "m0"
    assert j.spec.placement.node_label == "graphrun.io/machine"
    # the plan survives the round trip through YAML data (the ConfigMap's job.yaml)
    assert parse_job(j.to_dict()).spec.placement == j.spec.placement


def test_inline_plan_is_a_plan_file_pasted_verbatim() -> None:
    plan = {
        "apiVersion": "graphrun.io/v1alpha1",
        "kind": "PlacementPlan",
        "machines": ["a", "b"],
        "assignments": {"trainer:0": "b"},
    }
    j = parse_job(job(runtime={"machines": 2}, placement={"plan": plan}))
    assert resolve_placement(j)[RoleName.parse("trainer:0")] == "m1"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            _inline(["a", "b"], {"trainer:0": "c"}),
            "job.yaml: spec.placement.plan.assignments.trainer:0: machine 'c' is not in machines",
        ),
        (
            _inline(["a", "b"], {"trainer:x": "a"}),
            "job.yaml: spec.placement.plan.assignments.trainer:x: 'trainer:x' is not a role name",
        ),
        (
            _inline(["a", "a"], {}),
            "job.yaml: spec.placement.plan.machines: machine 'a' is listed twice",
        ),
        (
            _inline(["a", "b"], {}, assignments={}),
            "job.yaml: spec.placement: give at most one of assignments, planFile, plan",
        ),
        (
            _inline(["a", "b"], {}, nodeLabel="bad label"),
            "job.yaml: spec.placement.nodeLabel: String should match pattern",
        ),
        (
            job(placement={"plan": {"machines": ["a"], "assignments": {}, "score": 1}}),
            "job.yaml: spec.placement.plan.score: Extra inputs are not permitted",
        ),
    ],
)
def test_inline_plan_errors_name_the_field(data: dict[str, Any], expected: str) -> None:
    assert error_of(data).startswith(expected)


@pytest.mark.parametrize(
    ("machines", "assignments", "expected"),
    [
        (
            ["a", "b", "c"],
            {},
            "spec.placement.plan.machines: plan has 3 machines, the job has 2 "
            "(spec.runtime.machines)",
        ),
        (["a", "b"], {"trainer:4": "a"}, "spec.placement.plan.assignments.trainer:4: the job has"),
        (["a", "b"], {"store:2": "a"}, "spec.placement.plan.assignments.store:2: the job has no"),
        (["a", "b"], {"sampler:0:0": "b"}, "spec.placement.plan.assignments.sampler:0:0: the job"),
    ],
)
def test_inline_plan_not_matching_the_job(
    machines: list[str], assignments: dict[str, str], expected: str
) -> None:
    j = parse_job(_inline(machines, assignments))
    with pytest.raises(SpecError) as info:
        resolve_placement(j)
    assert str(info.value).startswith(expected)


def test_backups_follow_their_main_store_server() -> None:
    runtime = {"machines": 2, "storeServersPerMachine": 2}
    j = parse_job(job(runtime=runtime, placement={"assignments": {"store:0": "m1"}}))
    placement = resolve_placement(j)
    assert placement[RoleName.parse("store:0")] == placement[RoleName.parse("store:0:1")] == "m1"
    assert placement[RoleName.parse("store:1")] == placement[RoleName.parse("store:1:1")] == "m1"
    plan = {"machines": ["a", "b"], "assignments": {"store:1": "a", "store:1:1": "b"}}
    j = parse_job(job(runtime=runtime, placement={"plan": plan}))
    with pytest.raises(SpecError) as info:
        resolve_placement(j)
    assert str(info.value) == (
        "spec.placement.plan.assignments.store:1:1: a backup store server runs on its main "
        "server's machine (store:1 is on m0): it shares its memory"
    )


def test_sampler_workers_follow_their_trainer_and_a_plan_cannot_move_them() -> None:
    # the simulator placed sampler workers freely while the runtime silently kept them
    # with their trainer: a plan that moves one is refused, naming the field
    runtime = {"machines": 2, "samplerWorkersPerTrainer": 1}
    j = parse_job(job(runtime=runtime, placement={"assignments": {"trainer:0": "m1"}}))
    assert resolve_placement(j)[RoleName.parse("sampler:0:0")] == "m1"
    plan = {"machines": ["a", "b"], "assignments": {"trainer:0": "a", "sampler:0:0": "b"}}
    j = parse_job(job(runtime=runtime, placement={"plan": plan}))
    with pytest.raises(SpecError) as info:
        resolve_placement(j)
    assert str(info.value).startswith(
        "spec.placement.plan.assignments.sampler:0:0: sampler workers run on their trainer's "
        "machine (trainer:0 is on m0)"
    )


def test_a_job_on_a_running_store_has_no_store_roles() -> None:
    from graphrun.job.spec import job_roles

    d = job(graph={"store": {"addresses": ["tcp://a:1", "tcp://b:2"], "keyFile": "k"}})
    spec = parse_job(d).spec
    assert spec.num_parts == 2
    assert [r.kind for r in job_roles(spec)] == ["trainer"]


def test_replicas_go_to_the_next_machine_and_never_beside_their_primary() -> None:
    runtime = {"machines": 3, "replicas": 2}
    j = parse_job(job(runtime=runtime, placement={"assignments": {"store:0": "m1"}}))
    placement = resolve_placement(j)
    assert [placement[RoleName.store(p, replica=1)] for p in range(3)] == ["m2", "m2", "m0"]
    bad = {"store:1:r": "m1"}
    with pytest.raises(SpecError) as info:
        resolve_placement(parse_job(job(runtime=runtime, placement={"assignments": bad})))
    assert str(info.value) == (
        "spec.placement.assignments.store:1:r: a replica must run on another machine than "
        "the other copies of partition 1 (m1)"
    )


def test_replicas_need_as_many_machines() -> None:
    with pytest.raises(SpecError, match="replicas: 2 copies of each partition need as many"):
        parse_job(job(runtime={"machines": 1, "replicas": 2}))


def test_elastic() -> None:
    runtime = {"machines": 3, "replicas": 2, "elastic": {"minMachines": 2}}
    e = parse_job(job(runtime=runtime)).spec.runtime.elastic
    assert e is not None and e.min_machines == 2 and e.timeout_seconds == 60.0
    assert e.max_rejoins == 2  # a lost machine is started again to re-join, twice at most


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"runtime": {"machines": 3, "elastic": {"minMachines": 2}}},
            "elastic: needs replicas: 2",
        ),
        (
            {"runtime": {"machines": 2, "replicas": 2, "elastic": {"minMachines": 3}}},
            "elastic.minMachines: 3 is more than the job's 2 machines",
        ),
        (
            {"runtime": {"machines": 2, "replicas": 2, "elastic": {"minMachines": 0}}},
            "spec.runtime.elastic.minMachines",
        ),
        (
            {"runtime": {"machines": 2, "replicas": 2, "elastic": {}}},
            "spec.runtime.elastic.minMachines",
        ),
        (
            {
                "runtime": {
                    "machines": 2,
                    "replicas": 2,
                    "elastic": {"minMachines": 1, "maxRejoins": -1},
                }
            },
            "spec.runtime.elastic.maxRejoins",
        ),
        (
            {
                "runtime": {"machines": 2, "replicas": 2, "elastic": {"minMachines": 1}},
                "training": {"task": "link-prediction"},
            },
            "runtime.elastic: only for training.task node-classification",
        ),
        (
            {
                "runtime": {"machines": 2, "replicas": 2, "elastic": {"minMachines": 1}},
                "training": {"task": "node-classification", "sync": "ps"},
            },
            "runtime.elastic: only with training.sync: allreduce",
        ),
    ],
)
def test_elastic_errors(spec: dict[str, Any], expected: str) -> None:
    assert expected in error_of(job(**spec))
