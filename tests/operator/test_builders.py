"""Golden files of every builder; every object validated against the official schemas.

Regenerate the golden files after an intended change with
``GRAPHRUN_UPDATE_GOLDEN=1 python -m pytest tests/operator/test_builders.py``.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from graphrun.errors import SpecError
from graphrun.job.spec import GraphJob, load_job, parse_job
from graphrun.names import RoleName
from graphrun.operator import builders as B
from graphrun.operator import gang as G
from graphrun.operator import layout as L
from graphrun.operator import rendezvous as RZ
from graphrun.operator.keys import CurveKeyPair, curve_public, z85_encode
from graphrun.operator.policy import check_pod_policy
from graphrun.operator.probe import build_probe_job, probe_spec
from graphrun.wire import convert_json

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
K8S = kubernetes_validate.latest_version()
WORKLOAD_API_K8S = "1.36.0"  # the Kubernetes release whose schemas hold Workload v1alpha2
OWNER = L.Owner("graphsage", "ml", "0b7e3c2a-0000-4000-8000-000000000001")
CONFIG = L.OperatorConfig()
SECRET = z85_encode(bytes(range(32)))
KEYS = CurveKeyPair(curve_public(SECRET), SECRET)


def example() -> GraphJob:
    return load_job(ROOT / "examples" / "kubernetes" / "graphsage.yaml")


def gang_job() -> GraphJob:
    """Every optional feature: gang scheduling, a launcher, backups, samplers, placement."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["metadata"]["name"] = "gang"
    spec = d["spec"]
    spec["graph"] = {"dataset": "datasets/products"}
    spec["runtime"] = {
        "machines": 2,
        "storeServersPerMachine": 2,
        "trainersPerMachine": 2,
        "samplerWorkersPerTrainer": 1,
    }
    spec["placement"] = {"assignments": {"trainer:0": "m1", "trainer:1": "m1"}}
    spec["runPolicy"]["schedulingPolicy"] = {
        "provider": "volcano",
        "queue": "research",
        "priorityClass": "high",
    }
    spec["replicaSpecs"]["launcher"] = {
        "template": {
            "spec": {
                "containers": [
                    {"name": "graphrun", "command": ["python", "/data/report.py"]},
                    {"name": "sidecar", "image": "busybox", "command": ["sleep", "1"]},
                ]
            }
        }
    }
    return parse_job(d)


def planned_job() -> GraphJob:
    """A placement plan inline: machine 0 serves both partitions, 1 and 2 train."""
    return load_job(ROOT / "examples" / "kubernetes" / "planned.yaml")


def distributed_job() -> GraphJob:
    """partition.mode distributed: the worker pods partition (no partitioner Job)."""
    return load_job(ROOT / "examples" / "kubernetes" / "distributed.yaml")


def queued_job() -> GraphJob:
    """Queued by Kueue (a pod group), gang-scheduled by the Workload API, a launcher."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "kueue" / "graphsage.yaml").read_text())
    d["spec"]["replicaSpecs"]["launcher"] = {
        "template": {"spec": {"containers": [{"name": "graphrun", "command": ["true"]}]}}
    }
    return parse_job(d)


def rendezvous_job() -> GraphJob:
    """runtime.elastic: a rendezvous pod serves the trainers' rendezvous apart."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["metadata"]["name"] = "elastic"
    d["spec"]["partition"]["parts"] = 3
    d["spec"]["runtime"] = {"machines": 3, "replicas": 2, "elastic": {"minMachines": 2}}
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["tolerations"] = [
        {"key": "preemptible", "operator": "Exists", "effect": "NoSchedule"}
    ]
    return parse_job(d)


def built(job: GraphJob) -> dict[str, dict[str, Any]]:
    owner = L.Owner(job.name, OWNER.namespace, OWNER.uid)
    out = {
        "secret": B.build_secret(owner, KEYS),
        "configmap": B.build_configmap(job, owner, CONFIG),
        "service": B.build_service(owner, L.rendezvous_apart(job)),
        "networkpolicy": B.build_network_policy(owner),
        "partitioner": B.build_partitioner(job, owner, CONFIG),
        "worker-0": B.build_worker(job, owner, CONFIG, 0),
        "worker-1-resume": B.build_worker(job, owner, CONFIG, 1, resume=True),
    }
    if L.partitions_on_workers(job):
        del out["partitioner"]  # never made: the worker pods partition
    if job.spec.replica_specs.launcher:
        out["launcher"] = B.build_launcher(job, owner, CONFIG)
    if L.rendezvous_apart(job):
        out["rendezvous"] = RZ.build_rendezvous(job, owner, CONFIG)
    podgroup = G.build_podgroup(job, owner)
    if podgroup:
        out["podgroup"] = podgroup
    for obj in G.build_workload(job, owner):
        out[f"{obj['kind'].lower()}-{obj['metadata']['name']}"] = obj
    return out


JOBS = {
    "graphsage": example,
    "gang": gang_job,
    "planned": planned_job,
    "distributed": distributed_job,
    "queued": queued_job,
    "elastic": rendezvous_job,
}
CASES = [
    (f"{job_name}-{obj}", job_name, obj)
    for job_name, job_fn in JOBS.items()
    for obj in built(job_fn())
]


@pytest.mark.parametrize(("golden", "job_name", "obj"), CASES, ids=[c[0] for c in CASES])
def test_golden(golden: str, job_name: str, obj: str) -> None:
    got = yaml.safe_dump(built(JOBS[job_name]())[obj], sort_keys=True)
    path = GOLDEN / f"{golden}.yaml"
    if os.environ.get("GRAPHRUN_UPDATE_GOLDEN"):
        path.write_text(got)
    assert path.exists(), f"missing golden file {path}; set GRAPHRUN_UPDATE_GOLDEN=1"
    assert got == path.read_text()


@pytest.mark.parametrize(("golden", "job_name", "obj"), CASES, ids=[c[0] for c in CASES])
def test_valid_kubernetes_object(golden: str, job_name: str, obj: str) -> None:
    o = built(JOBS[job_name]())[obj]
    if o["apiVersion"].startswith("scheduling.k8s.io/") or "schedulingGroup" in o.get("spec", {}):
        # the Workload API (scheduling.k8s.io/v1alpha2, Pod spec.schedulingGroup): 1.36
        kubernetes_validate.validate(o, WORKLOAD_API_K8S, strict=True)
        return
    if o["kind"] == "PodGroup":
        pytest.skip("PodGroup is a Volcano/scheduler-plugins CRD, not in the official schemas")
    kubernetes_validate.validate(o, K8S, strict=True)


def test_validation_catches_a_broken_pod() -> None:
    pod = copy.deepcopy(built(example())["worker-0"])
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "thirty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S, strict=True)


def test_every_child_is_owned() -> None:
    for obj in built(gang_job()).values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == OWNER.uid and ref["controller"] is True
        assert obj["metadata"]["labels"][L.LABEL_JOB] == "gang"


def test_secret_holds_the_rpc_key_file() -> None:
    data = built(example())["secret"]["data"][L.KEY_FILE_NAME]
    key = json.loads(base64.b64decode(data))
    assert key == {"format": "graphrun-key", "version": 1, "public": KEYS.public, "secret": SECRET}


def test_key_file_is_what_the_rpc_layer_reads(tmp_path: Path) -> None:
    auth = pytest.importorskip("graphrun.rpc.auth")
    data = built(example())["secret"]["data"][L.KEY_FILE_NAME]
    (tmp_path / "job.key").write_bytes(base64.b64decode(data))
    (tmp_path / "job.key").chmod(0o400)  # as the pod mounts it (the Secret volume's mode)
    keys = auth.load_keys(tmp_path / "job.key")
    assert (keys.public, keys.secret) == (KEYS.public, KEYS.secret)


def test_hosts_in_machine_order_with_stable_dns_names() -> None:
    cm = built(gang_job())["configmap"]["data"]
    hosts = json.loads(cm["hosts.json"])
    assert [m["name"] for m in hosts["machines"]] == ["m0", "m1"]
    assert hosts["machines"][1]["address"] == "gang-worker-1.gang-workers.ml.svc.cluster.local"
    assert list(hosts["endpoints"]) == ["store:0", "store:0:1", "store:1", "store:1:1"]
    assert hosts["endpoints"]["store:1:1"].endswith(
        "gang-worker-1.gang-workers.ml.svc.cluster.local:30003"
    )
    # trainer:0 is placed on m1, so the rendezvous is there
    assert hosts["rendezvous"] == "gang-worker-1.gang-workers.ml.svc.cluster.local:30004"


def test_hosts_file_is_what_the_launcher_reads() -> None:
    hosts_mod = pytest.importorskip("graphrun.job.hosts")
    cm = built(gang_job())["configmap"]["data"]
    hosts = convert_json(hosts_mod.Hosts, json.loads(cm["hosts.json"]), "hosts.json")
    assert hosts.store_endpoints()[0][1].port == 30001


def test_rendered_job_loads_with_absolute_paths() -> None:
    cm = built(example())["configmap"]["data"]
    job = parse_job(yaml.safe_load(cm["job.yaml"]))
    assert job.spec.graph.dataset == "/data/runs/graphsage/data-community-4f8652e3"
    assert job.spec.graph.generator is None
    assert job.spec.partition.output == "/data/graphsage/parts"
    assert job.spec.training.checkpoint_dir == "/data/graphsage/checkpoints"
    assert job.spec.replica_specs.worker is None


def test_worker_pod_runs_the_agreed_command() -> None:
    pod = built(example())["worker-0"]
    (c,) = pod["spec"]["containers"]
    assert c["command"] + c["args"] == [
        "graphrun", "worker", "--job", "/etc/graphrun/job.yaml", "--machine", "$(MACHINE_INDEX)",
        "--hosts-file", "/etc/graphrun/hosts.json", "--keys", "/etc/graphrun/keys",
        # metrics.jsonl and tensorboard/ on the shared volume, not in the read-only ConfigMap
        "--run-dir", "/data/runs/graphsage",
        "--grace", "57",  # half of what the default terminationGracePeriodSeconds leaves
    ]  # fmt: skip
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert {"name": "MACHINE_INDEX", "value": "0"} in c["env"]
    assert c["resources"]["limits"]["memory"] == "4Gi"  # the user's template is kept
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["subdomain"] == "graphsage-workers"
    resumed = built(example())["worker-1-resume"]["spec"]["containers"][0]["args"]
    assert resumed[-1] == "--resume"


def test_partitioner_script_generates_then_partitions() -> None:
    script = B.partitioner_script(example())
    assert (
        "graphrun generate community /data/runs/graphsage/data-community-4f8652e3 --nodes 20000"
        in script
    )
    assert "--avg-degree 15" in script
    assert (
        "graphrun partition /data/runs/graphsage/data-community-4f8652e3 /data/graphsage/parts "
        "--parts 2 --mode single --method metis --halo 1 --balance-train"
    ) in script
    assert "test -e /data/graphsage/parts/partition.json ||" in script


def test_parallel_mode_runs_kaminpar_in_the_partitioner_job() -> None:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["partition"]["mode"] = "parallel"
    d["spec"]["partition"].pop("method", None)
    script = B.partitioner_script(parse_job(d))
    assert "--parts 2 --mode parallel --method kaminpar --halo 1" in script


def test_sidecar_keeps_its_own_image_and_graphrun_container_found_by_name() -> None:
    pod = built(gang_job())["launcher"]
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["graphrun", "sidecar"]
    main, side = pod["spec"]["containers"]
    assert main["command"] == ["python", "/data/report.py"]
    assert side["image"] == "busybox" and "volumeMounts" not in side


def test_gang_scheduling() -> None:
    objs = built(gang_job())
    assert objs["podgroup"]["spec"] == {
        "minMember": 3,
        "queue": "research",
        "priorityClassName": "high",
    }
    pod = objs["worker-0"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "gang"
    d = gang_job().model_dump(by_alias=True)
    d["spec"]["runPolicy"]["schedulingPolicy"] = {
        "provider": "scheduler-plugins",
        "scheduleTimeoutSeconds": 60,
    }
    job = parse_job(d)
    owner = L.Owner("gang", "ml", "u")
    assert G.build_podgroup(job, owner)["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"  # type: ignore[index]
    pod = B.build_worker(job, owner, CONFIG, 0)
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang"
    assert G.build_podgroup(example(), owner) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"placement": {"planFile": "plan.yaml"}},
            "spec.placement.planFile: the operator cannot read files from your machine; put "
            "the plan inline as spec.placement.plan",
        ),
        (
            {"placement": {"plan": {"machines": ["a", "b", "c"], "assignments": {}}}},
            "spec.placement.plan.machines: plan has 3 machines, the job has 2 "
            "(spec.runtime.machines)",
        ),
        (
            {"placement": {"plan": {"machines": ["a", "b"], "assignments": {"trainer:2": "a"}}}},
            "spec.placement.plan.assignments.trainer:2: the job has no such role",
        ),
        (
            {"placement": {"plan": {"machines": ["a", "Node_B"], "assignments": {}}}},
            "spec.placement.plan.machines[1]: 'Node_B' is not a Kubernetes node name",
        ),
        (
            {
                "placement": {
                    "plan": {"machines": ["a", "b c"], "assignments": {}},
                    "nodeLabel": "graphrun.io/machine",
                }
            },
            "spec.placement.plan.machines[1]: 'b c' is not a value of node label "
            "graphrun.io/machine",
        ),
        ({"sharedVolume": None}, "spec.sharedVolume: required on Kubernetes"),
        (
            {"replicaSpecs": {"launcher": {"template": {}}}},
            "spec.replicaSpecs.launcher.template: the launcher container needs a command",
        ),
        (
            {"placement": {"assignments": {"trainer:7": "m0"}}},
            "spec.placement.assignments.trainer:7: the job has no such role",
        ),
    ],
)
def test_unsupported_specs_are_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    for k, v in change.items():
        if v is None:
            d["spec"].pop(k)
        elif isinstance(v, dict) and isinstance(d["spec"].get(k), dict):
            d["spec"][k] = {**d["spec"][k], **v}
        else:
            d["spec"][k] = v
    with pytest.raises(SpecError) as info:
        B.check_supported(parse_job(d))
    assert str(info.value).startswith(field)


def test_the_worker_can_load_what_the_operator_mounts(tmp_path: Path) -> None:
    """The ConfigMap and Secret laid out as in /etc/graphrun, read by `graphrun worker`'s
    loader (graphrun.machine.roles, from the launcher's side of the contract)."""
    roles = pytest.importorskip("graphrun.machine.roles")
    job = example()
    owner = L.Owner(job.name, "ml", "u")
    for name, text in B.build_configmap(job, owner, CONFIG)["data"].items():
        (tmp_path / name).write_text(text)
    (tmp_path / "keys").mkdir()
    key = base64.b64decode(B.build_secret(owner, KEYS)["data"][L.KEY_FILE_NAME])
    (tmp_path / "keys" / L.KEY_FILE_NAME).write_bytes(key)
    for index in range(job.spec.runtime.machines):
        launch = roles.load_job_launch(
            tmp_path / "job.yaml", str(index), tmp_path / "hosts.json", tmp_path / "keys"
        )
        assert launch.machine == f"m{index}"
        text = repr(launch)
        assert (
            f"graphsage-worker-{index}.graphsage-workers.ml.svc.cluster.local:3000{index}" in text
        )
        assert "/data/graphsage/parts" in text
    # the pod's own arguments, with the mounts moved here: trainers write metrics.jsonl
    # and tensorboard/ to the run directory on the shared volume
    from graphrun.cli import build_parser
    from graphrun.cli.worker import _launch

    (c,) = built(example())["worker-0"]["spec"]["containers"]
    argv = [a.replace("/etc/graphrun", str(tmp_path)) for a in c["args"]]
    argv = [a.replace("$(MACHINE_INDEX)", "0") for a in argv]
    launch = _launch(build_parser().parse_args(argv))
    (trainer,) = launch.of_kind("trainer")
    i = trainer.argv.index("--run-dir")
    assert trainer.argv[i + 1] == "/data/runs/graphsage"


def test_generator_parameters_become_generate_flags() -> None:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["graph"]["generator"] = {
        "name": "academic",
        "params": {"nodes": 100, "featDim": 8, "reverse": False, "homophily": 0.5},
    }
    script = B.partitioner_script(parse_job(d))
    assert re.search(
        r"graphrun generate academic /data/runs/graphsage/data-academic-\w+ "
        r"--nodes 100 --feat-dim 8",
        script,
    )
    assert "--no-reverse --homophily 0.5" in script


# --- partition.mode distributed ----------------------------------------------------------


def test_distributed_workers_partition_first_in_an_init_container() -> None:
    job = distributed_job()
    B.check_supported(job)
    objs = built(job)
    worker_dns = "distributed-worker-0.distributed-workers.ml.svc.cluster.local"
    dataset = L.dataset_dir(job)
    for i, name in enumerate(("worker-0", "worker-1-resume")):
        spec = objs[name]["spec"]
        (init,) = spec["initContainers"]
        (main,) = spec["containers"]
        assert init["name"] == L.PARTITION_CONTAINER and init["command"] == ["sh", "-c"]
        assert init["image"] == main["image"] and init["resources"] == main["resources"]
        assert init["env"] == main["env"]
        assert init["volumeMounts"] == [{"name": B.DATA_VOLUME, "mountPath": "/data"}]
        script = init["args"][0]
        assert (
            f"test -e /data/distributed/parts/partition.json || graphrun partition {dataset} "
            "/data/distributed/parts --parts 2 --mode distributed --halo 1 --balance-train "
            f"--rank {i} --rendezvous tcp://{worker_dns}:{L.PARTITION_PORT} --timeout 600"
        ) in script
        assert main["args"][:2] == ["worker", "--job"]  # then serves as in the other modes
    first = objs["worker-0"]["spec"]["initContainers"][0]
    assert (
        f"test -e {dataset}/chunks.json || graphrun generate community {dataset}"
        in (first["args"][0])
    )
    assert first["args"][0].split("\n")[1].endswith("--seed 0 --chunks 2")  # one per rank
    assert first["ports"] == [
        {"name": "partition", "containerPort": L.PARTITION_PORT, "protocol": "TCP"}
    ]
    second = objs["worker-1-resume"]["spec"]["initContainers"][0]
    assert f"until test -e {dataset}/chunks.json; do sleep 2; done" in second["args"][0]
    assert "graphrun generate" not in second["args"][0] and "ports" not in second


def test_distributed_generated_graph_is_not_the_whole_one() -> None:
    """The same generator in chunks lives elsewhere than written whole (a job changed
    from mode single to distributed while suspended must not find the whole graph)."""
    chunked = distributed_job()
    d = chunked.model_dump(by_alias=True, exclude_none=True)
    d["spec"]["partition"]["mode"] = "single"
    whole = parse_job(d)
    assert L.dataset_dir(chunked) != L.dataset_dir(whole)
    assert L.dataset_dir(whole).startswith("/data/runs/distributed/data-community-")


def test_distributed_needs_a_worker_pod_on_every_machine() -> None:
    d = planned_job().model_dump(by_alias=True, exclude_none=True)
    d["spec"]["partition"] = {"mode": "distributed", "output": "planned/parts"}
    plan = d["spec"]["placement"]["plan"]
    plan["assignments"].update({"store:2": "node-big-mem", "trainer:2": "node-gpu-0"})
    plan.pop("demands")
    with pytest.raises(SpecError) as info:
        B.check_supported(parse_job(d))
    assert str(info.value).startswith(
        "spec.partition.mode: 'distributed' runs one partition rank in every machine's worker "
        "pod, but the placement gives machine m2 (the plan's node-gpu-1) no store server and "
        "no trainer"
    )
    plan["assignments"]["trainer:2"] = "node-gpu-1"
    B.check_supported(parse_job(d))


# --- placement plans ---------------------------------------------------------------------


def _node_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    required = pod["spec"]["affinity"]["nodeAffinity"]
    return list(required["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])


def test_plan_binds_each_worker_to_its_node_and_gives_it_its_roles() -> None:
    job = planned_job()
    owner = L.Owner(job.name, "ml", "u")
    nodes = ["node-big-mem", "node-gpu-0", "node-gpu-1"]
    roles = ["store:0,store:1", "trainer:0,trainer:1", "trainer:2"]
    for i in range(3):
        pod = B.build_worker(job, owner, CONFIG, i)
        assert _node_terms(pod) == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [nodes[i]]}]}
        ]
        assert pod["metadata"]["annotations"][L.ANNOTATION_ROLES] == roles[i]
    ports = [c.get("ports") for c in B.build_worker(job, owner, CONFIG, 0)["spec"]["containers"]]
    assert [p["containerPort"] for p in ports[0]] == [30000, 30001]
    # the rendezvous (torch.distributed store) is on trainer 0's pod, which has no store
    worker1 = B.build_worker(job, owner, CONFIG, 1)["spec"]["containers"][0]
    assert [p["name"] for p in worker1["ports"]] == ["rendezvous"]
    assert "readinessProbe" not in worker1
    assert "affinity" not in B.build_worker(example(), owner, CONFIG, 0)["spec"]


def test_plan_machines_may_be_node_label_values() -> None:
    d = planned_job().model_dump(by_alias=True, exclude_none=True)
    d["spec"]["placement"]["nodeLabel"] = "graphrun.io/machine"
    pod = B.build_worker(parse_job(d), OWNER, CONFIG, 2)
    assert _node_terms(pod) == [
        {
            "matchExpressions": [
                {"key": "graphrun.io/machine", "operator": "In", "values": ["node-gpu-1"]}
            ]
        }
    ]
    kubernetes_validate.validate(pod, K8S, strict=True)


def test_plan_affinity_is_anded_with_the_users_node_affinity() -> None:
    d = planned_job().model_dump(by_alias=True, exclude_none=True)
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    gpu = {"key": "gpu", "operator": "Exists"}
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [gpu]}]
            }
        }
    }
    job = parse_job(d)
    pod = B.build_worker(job, OWNER, CONFIG, 1)
    mine = {"key": "metadata.name", "operator": "In", "values": ["node-gpu-0"]}
    assert _node_terms(pod) == [
        {"matchExpressions": [zone], "matchFields": [mine]},
        {"matchExpressions": [gpu], "matchFields": [mine]},
    ]
    # the user's template itself is not changed
    template = job.spec.replica_specs.worker.template  # type: ignore[union-attr]
    assert "matchFields" not in str(template)


def test_machines_without_stores_or_trainers_get_no_pod() -> None:
    d = planned_job().model_dump(by_alias=True, exclude_none=True)
    d["spec"]["runtime"]["machines"] = 4
    d["spec"]["runtime"]["samplerWorkersPerTrainer"] = 1
    plan = d["spec"]["placement"]["plan"]
    plan["machines"].append("node-idle")
    plan["assignments"]["trainer:3"] = "node-gpu-1"
    plan["assignments"]["sampler:3:0"] = "node-gpu-1"  # samplers run in their trainer's pod
    job = parse_job(d)
    assert L.worker_indices(job) == [0, 1, 2]
    assert L.machine_roles(job)[2] == [RoleName.trainer(2), RoleName.trainer(3)]
    d["spec"]["runPolicy"]["schedulingPolicy"] = {"provider": "volcano"}
    assert G.build_podgroup(parse_job(d), OWNER)["spec"]["minMember"] == 3  # type: ignore[index]


def test_planned_hosts_resolve_every_store_and_trainer(tmp_path: Path) -> None:
    """Every worker pod's launch, as `graphrun worker` builds it from the mounted ConfigMap,
    runs exactly the roles of its annotation, and every store endpoint and the rendezvous
    are DNS names of pods that exist."""
    roles_mod = pytest.importorskip("graphrun.machine.roles")
    job = planned_job()
    owner = L.Owner(job.name, "ml", "u")
    objs = built(job)
    for name, text in objs["configmap"]["data"].items():
        (tmp_path / name).write_text(text)
    hosts = json.loads((tmp_path / "hosts.json").read_text())
    pods = {i: B.build_worker(job, owner, CONFIG, i) for i in L.worker_indices(job)}
    dns = {i: L.worker_dns(owner, i, CONFIG) for i in pods}
    assert hosts["endpoints"] == {
        "store:0": f"{dns[0]}:30000",
        "store:1": f"{dns[0]}:30001",
    }
    assert hosts["rendezvous"] == f"{dns[1]}:30002"
    for i, pod in pods.items():
        launch = roles_mod.load_job_launch(
            tmp_path / "job.yaml", str(i), tmp_path / "hosts.json", None
        )
        ran = ",".join(str(r.role) for r in launch.roles)
        assert ran == pod["metadata"]["annotations"][L.ANNOTATION_ROLES]
        ports = pod["spec"]["containers"][0].get("ports", [])
        opened = {f"{dns[i]}:{p['containerPort']}" for p in ports if p["name"] != "rendezvous"}
        assert opened == {str(r.ready) for r in launch.roles if r.ready}


def test_worker_pods_get_a_memory_backed_dev_shm() -> None:
    """Worker pods mounted no /dev/shm: 64 MiB, and any real partition killed the store."""
    pod = B.build_worker(example(), OWNER, CONFIG, 0)
    main = pod["spec"]["containers"][0]
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    limit = main["resources"]["limits"]["memory"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": limit}


def _container(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "graphrun", **fields}]}


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ({"hostNetwork": True}, "spec.hostNetwork"),
        ({"serviceAccountName": "cluster-admin-sa"}, "spec.serviceAccountName"),
        ({"automountServiceAccountToken": True}, "spec.automountServiceAccountToken"),
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, r"spec.volumes\[0\].hostPath"),
        (
            {"containers": [{"name": "graphrun", "securityContext": {"privileged": True}}]},
            r"spec.containers\[0\].securityContext",
        ),
        (
            {
                "initContainers": [
                    {"name": "x", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}
                ]
            },
            r"spec.initContainers\[0\].securityContext.capabilities.add",
        ),
        # issue 26: what the policy let through
        (
            {
                "volumes": [
                    {
                        "name": "t",
                        "projected": {
                            "sources": [
                                {"configMap": {"name": "c"}},
                                {"serviceAccountToken": {"path": "token"}},
                            ]
                        },
                    }
                ]
            },
            r"spec.volumes\[0\].projected.sources\[1\].serviceAccountToken",
        ),
        (
            {"volumes": [{"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]},
            r"spec.volumes\[0\].nfs",
        ),
        (
            {"volumes": [{"name": "g", "gitRepo": {"repository": "x"}}]},
            r"spec.volumes\[0\].gitRepo",
        ),
        (
            _container(ports=[{"containerPort": 80, "hostPort": 80}]),
            r"spec.containers\[0\].ports\[0\].hostPort",
        ),
        ({"nodeName": "control-plane-1"}, "spec.nodeName"),
        ({"priorityClassName": "system-node-critical"}, "spec.priorityClassName"),
        ({"tolerations": [{"operator": "Exists"}]}, r"spec.tolerations\[0\]"),
        (
            {
                "tolerations": [
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                ]
            },
            r"spec.tolerations\[0\].key",
        ),
        (
            {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            "spec.securityContext.seccompProfile.type",
        ),
        (
            _container(securityContext={"seccompProfile": {"type": "Unconfined"}}),
            r"spec.containers\[0\].securityContext.seccompProfile.type",
        ),
        (
            _container(securityContext={"appArmorProfile": {"type": "Unconfined"}}),
            r"spec.containers\[0\].securityContext.appArmorProfile.type",
        ),
        (
            {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}},
            r"spec.securityContext.sysctls\[0\].name",
        ),
        ({"securityContext": {"runAsUser": 0}}, "spec.securityContext.runAsUser"),
        (
            _container(securityContext={"runAsUser": 0}),
            r"spec.containers\[0\].securityContext.runAsUser",
        ),
        ({"securityContext": {"runAsNonRoot": False}}, "spec.securityContext.runAsNonRoot"),
        ({"securityContext": {"runAsGroup": 0}}, "spec.securityContext.runAsGroup"),
        (
            {"securityContext": {"supplementalGroups": [0]}},
            "spec.securityContext.supplementalGroups",
        ),
        # more of the same kind (Pod Security Standards, baseline)
        (
            _container(securityContext={"allowPrivilegeEscalation": True}),
            r"spec.containers\[0\].securityContext.allowPrivilegeEscalation",
        ),
        (
            _container(securityContext={"procMount": "Unmasked"}),
            r"spec.containers\[0\].securityContext.procMount",
        ),
        (
            {"securityContext": {"windowsOptions": {"hostProcess": True}}},
            "spec.securityContext.windowsOptions.hostProcess",
        ),
        (
            {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
            "spec.securityContext.seLinuxOptions.type",
        ),
        (
            _container(livenessProbe={"httpGet": {"host": "169.254.169.254", "port": 80}}),
            r"spec.containers\[0\].livenessProbe.httpGet.host",
        ),
        (
            _container(lifecycle={"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}}),
            r"spec.containers\[0\].lifecycle.preStop.tcpSocket.host",
        ),
    ],
)
def test_pod_templates_follow_the_pod_policy(pod: dict, field: str) -> None:
    """Templates passed through with any serviceAccountName, hostPath or privileged: a
    GraphJob's create rights were pod create rights with anything in them. Then (issue
    26) with a projected token, nfs, hostPort, nodeName, tolerations of everything,
    seccomp/AppArmor unconfined, unsafe sysctls, root."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"].update(pod)
    with pytest.raises(SpecError, match=f"spec.replicaSpecs.worker.template.{field}"):
        B.check_supported(parse_job(d))
    B.check_supported(example())  # the examples follow it


def test_the_jobs_priority_class_is_not_a_system_one() -> None:
    """schedulingPolicy.priorityClass system-node-critical: the job's pods could preempt
    the cluster's own."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["runPolicy"]["schedulingPolicy"] = {
        "provider": "volcano",
        "priorityClass": "system-cluster-critical",
    }
    with pytest.raises(SpecError, match=r"spec\.runPolicy\.schedulingPolicy\.priorityClass"):
        B.check_supported(parse_job(d))
    d["spec"]["runPolicy"]["schedulingPolicy"]["priorityClass"] = "high"
    B.check_supported(parse_job(d))


def test_unconfined_annotations_are_refused() -> None:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    meta = d["spec"]["replicaSpecs"]["partitioner"]["template"].setdefault("metadata", {})
    meta["annotations"] = {"container.apparmor.security.beta.kubernetes.io/graphrun": "unconfined"}
    with pytest.raises(SpecError, match=r"partitioner.template.metadata.annotations\[container"):
        B.check_supported(parse_job(d))


def test_what_a_graphrun_pod_needs_passes_the_pod_policy() -> None:
    """Keyed tolerations, safe sysctls, a non-root user, the allowed volume types and a
    probe of the pod itself stay allowed."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"].update(
        {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
                "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}],
            },
            "volumes": [
                {"name": "e", "emptyDir": {}},
                {"name": "p", "projected": {"sources": [{"downwardAPI": {"items": []}}]}},
            ],
            **_container(readinessProbe={"httpGet": {"port": 8080}}),
        }
    )
    B.check_supported(parse_job(d))


@pytest.mark.parametrize("job_name", JOBS)
def test_the_operators_own_pods_follow_the_pod_policy(job_name: str) -> None:
    """What the operator adds (config and data volumes, /dev/shm, ports, the partition
    init container) passes the policy it holds the user's templates to."""
    for name, obj in built(JOBS[job_name]()).items():
        if obj["kind"] == "Pod":
            check_pod_policy({"metadata": obj["metadata"], "spec": obj["spec"]}, name)
        elif obj["kind"] == "Job":
            check_pod_policy(obj["spec"]["template"], name)


def test_the_probe_job_follows_the_pod_policy() -> None:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ]
    for job in (example(), parse_job(d)):
        pod = build_probe_job(probe_spec(job, "ml", suffix="abcde"))["spec"]["template"]
        check_pod_policy(pod, "probe")


def test_a_templates_pod_security_context_keeps_the_volumes_group() -> None:
    """A template with a pod securityContext (runAsNonRoot, for a "restricted"
    namespace) lost fsGroup 10001: the image's user could not write the shared volume."""
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod = B.build_worker(parse_job(d), OWNER, CONFIG, 0)
    assert pod["spec"]["securityContext"] == {
        "fsGroup": B.IMAGE_UID,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    d["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["securityContext"] = {"fsGroup": 2000}
    assert B.build_worker(parse_job(d), OWNER, CONFIG, 0)["spec"]["securityContext"] == {
        "fsGroup": 2000
    }


def test_workload_api_gang_one_pod_group_per_role_group() -> None:
    objs = built(queued_job())
    workload = objs["workload-graphsage-queued"]
    templates = {t["name"]: t["schedulingPolicy"] for t in workload["spec"]["podGroupTemplates"]}
    assert templates == {
        "workers": {"gang": {"minCount": 2}},
        "launcher": {"gang": {"minCount": 1}},
    }
    assert workload["spec"]["controllerRef"] == {
        "apiGroup": "graphrun.io", "kind": "GraphJob", "name": "graphsage-queued",
    }  # fmt: skip
    workers = objs["podgroup-graphsage-queued-workers"]
    assert workers["spec"]["podGroupTemplateRef"]["workload"] == {
        "workloadName": "graphsage-queued", "podGroupTemplateName": "workers",
    }  # fmt: skip
    assert objs["worker-0"]["spec"]["schedulingGroup"] == {
        "podGroupName": "graphsage-queued-workers"
    }
    assert objs["launcher"]["spec"]["schedulingGroup"] == {
        "podGroupName": "graphsage-queued-launcher"
    }
    assert "schedulingGroup" not in objs["partitioner"]["spec"]["template"]["spec"]
    assert "schedulerName" not in objs["worker-0"]["spec"]  # the default scheduler
    # the schemas of 1.36 do reject a malformed one
    bad = copy.deepcopy(workers)
    bad["spec"]["schedulingPolicy"] = {"gang": {"minCount": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, WORKLOAD_API_K8S, strict=True)


def test_kueue_pod_group_is_the_workers_and_the_launcher_queues_alone() -> None:
    objs = built(queued_job())
    for name in ("worker-0", "worker-1-resume", "launcher"):
        meta, spec = objs[name]["metadata"], objs[name]["spec"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert spec["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
        if name != "launcher":  # made once the workers serve: queued alone
            assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == "graphsage-queued"
            assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    assert "kueue.x-k8s.io/pod-group-name" not in objs["launcher"]["metadata"]["labels"]
    part = objs["partitioner"]
    assert part["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"  # a batch Job
    assert "schedulingGates" not in part["spec"]["template"]["spec"]
    # the template's grace period is kept, and the worker's --grace follows it
    args = objs["worker-0"]["spec"]["containers"][0]["args"]
    assert objs["worker-0"]["spec"]["terminationGracePeriodSeconds"] == 180
    assert args[args.index("--grace") + 1] == "87"


def test_network_policy_admits_only_the_jobs_own_pods() -> None:
    objs = built(example())
    policy = objs["networkpolicy"]
    own = policy["spec"]["podSelector"]["matchLabels"]
    assert own == {
        "graphrun.io/job-name": "graphsage",
        "app.kubernetes.io/managed-by": "graphrun-operator",
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": own}}]
    # every pod the job makes is selected (and so both protected and admitted)
    for name in ("worker-0", "worker-1-resume"):
        labels = objs[name]["metadata"]["labels"]
        assert own.items() <= labels.items()
    part_labels = objs["partitioner"]["spec"]["template"]["metadata"]["labels"]
    assert own.items() <= part_labels.items()
    # a pod of another job is neither
    other = built(gang_job())["worker-0"]["metadata"]["labels"]
    assert not own.items() <= other.items()


def elastic_job(queue: str | None = None) -> GraphJob:
    d = yaml.safe_load((ROOT / "examples" / "kubernetes" / "graphsage.yaml").read_text())
    d["spec"]["partition"]["parts"] = 3
    d["spec"]["runtime"].update(machines=3, replicas=2, elastic={"minMachines": 2})
    if queue is not None:
        d["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = queue
    return parse_job(d)


def test_elastic_worker_reads_the_stop_mark_from_its_own_annotations() -> None:
    """runtime.elastic: the worker pod sees its annotations in a downward-API file of the
    config volume and is told to look there for graphrun.io/stop (a SIGTERM without it:
    this pod leaves alone); still valid and within the pod policy."""
    job = elastic_job()
    pod = B.build_worker(job, OWNER, CONFIG, 1)
    (c,) = pod["spec"]["containers"]
    at = c["args"].index("--stop-mark")
    assert c["args"][at + 1] == "/etc/graphrun/podinfo/annotations"
    assert {"name": B.CONFIG_VOLUME, "mountPath": "/etc/graphrun", "readOnly": True} in c[
        "volumeMounts"
    ]
    (config,) = [v for v in pod["spec"]["volumes"] if v["name"] == B.CONFIG_VOLUME]
    assert {
        "downwardAPI": {
            "items": [
                {"path": "podinfo/annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
            ]
        }
    } in config["projected"]["sources"]
    check_pod_policy(pod["spec"], "worker pod")
    kubernetes_validate.validate(pod, K8S, strict=True)
    # not elastic, or queued by Kueue (which deletes the pods unannounced): no mark
    for other in (example(), elastic_job(queue="research")):
        (c,) = B.build_worker(other, OWNER, CONFIG, 1)["spec"]["containers"]
        assert "--stop-mark" not in c["args"]


def test_a_lost_machines_replacement_runs_its_trainers_in_join_mode() -> None:
    job = distributed_job()
    pod = B.build_worker(job, OWNER, CONFIG, 1, resume=True, join=True)
    (c,) = pod["spec"]["containers"]
    assert {"name": "GRAPHRUN_ELASTIC_JOIN", "value": "1"} in c["env"]
    assert "initContainers" not in pod["spec"]  # its partition was made
    assert "readinessProbe" not in c  # no store server of its own
    assert pod["metadata"]["name"] == "graphsage-worker-1" and c["args"][-1] == "--resume"
    kubernetes_validate.validate(pod, K8S, strict=True)


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip


def test_the_rendezvous_pod_meets_the_restricted_pod_security_standard() -> None:
    """Pod Security Standards, restricted: non-root, no privilege escalation, every
    capability dropped, a RuntimeDefault seccomp profile, restricted volume types only."""
    objs = built(rendezvous_job())
    pod = objs["rendezvous"]
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["runAsUser"] != 0
    for c in [*spec["containers"], *spec.get("initContainers", [])]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "privileged" not in sc
        assert all("hostPort" not in p for p in c.get("ports", []))
    for v in spec["volumes"]:
        assert set(v) - {"name"} <= RESTRICTED_VOLUMES, v
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    # only the job's key, read-only; nothing of the shared volume
    (mount,) = spec["containers"][0]["volumeMounts"]
    assert mount == {"mountPath": L.KEYS_DIR, "name": "graphrun-keys", "readOnly": True}
    # the job's NetworkPolicy admits it and admits it only from the job's pods
    own = objs["networkpolicy"]["spec"]["podSelector"]["matchLabels"]
    assert own.items() <= pod["metadata"]["labels"].items()
    # the headless Service gives it a DNS name, which the hosts file points the trainers at
    selector = objs["service"]["spec"]["selector"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert spec["subdomain"] == objs["service"]["metadata"]["name"]
    hosts = json.loads(objs["configmap"]["data"]["hosts.json"])
    host, port = hosts["rendezvous"].rsplit(":", 1)
    assert host == f"{spec['hostname']}.{spec['subdomain']}.ml.svc.cluster.local"
    assert hosts["rendezvous_external"] is True
    assert spec["containers"][0]["ports"][0]["containerPort"] == int(port)
    assert f"tcp://*:{port}" in spec["containers"][0]["command"]
    # no worker pod listens on the rendezvous port any more
    for name in ("worker-0", "worker-1-resume"):
        (main,) = objs[name]["spec"]["containers"]
        assert int(port) not in [p["containerPort"] for p in main.get("ports", [])]
    # the user's tolerations (where the workers may run) are kept
    assert spec["tolerations"] == [
        {"key": "preemptible", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_a_job_that_is_not_elastic_keeps_trainer_0_serving_the_rendezvous() -> None:
    objs = built(example())
    hosts = json.loads(objs["configmap"]["data"]["hosts.json"])
    assert "rendezvous_external" not in hosts
    assert hosts["rendezvous"].startswith("graphsage-worker-0.")
    assert "rendezvous" not in objs
