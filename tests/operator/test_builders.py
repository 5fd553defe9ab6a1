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
from graphrun.operator import builders as B
from graphrun.operator import layout as L
from graphrun.operator.keys import CurveKeyPair, curve_public, z85_encode

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
K8S = kubernetes_validate.latest_version()
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


def built(job: GraphJob) -> dict[str, dict[str, Any]]:
    owner = L.Owner(job.name, OWNER.namespace, OWNER.uid)
    out = {
        "secret": B.build_secret(owner, KEYS),
        "configmap": B.build_configmap(job, owner, CONFIG),
        "service": B.build_service(owner),
        "partitioner": B.build_partitioner(job, owner, CONFIG),
        "worker-0": B.build_worker(job, owner, CONFIG, 0),
        "worker-1-resume": B.build_worker(job, owner, CONFIG, 1, resume=True),
    }
    if job.spec.replica_specs.launcher:
        out["launcher"] = B.build_launcher(job, owner, CONFIG)
    podgroup = B.build_podgroup(job, owner)
    if podgroup:
        out["podgroup"] = podgroup
    return out


CASES = [
    (f"{job_name}-{obj}", job_name, obj)
    for job_name, job_fn in (("graphsage", example), ("gang", gang_job))
    for obj in built(job_fn())
]
JOBS = {"graphsage": example, "gang": gang_job}


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
    hosts = hosts_mod.Hosts.from_dict(json.loads(cm["hosts.json"]))
    assert hosts.store_endpoints()[0][1].endswith(":30001")


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
    ]  # fmt: skip
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
        "--parts 2 --method metis --halo 1 --balance-train"
    ) in script
    assert "test -e /data/graphsage/parts/partition.json ||" in script


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
    assert B.build_podgroup(job, owner)["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"  # type: ignore[index]
    pod = B.build_worker(job, owner, CONFIG, 0)
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang"
    assert B.build_podgroup(example(), owner) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"partition": {"method": "parallel"}},
            "spec.partition.method: 'parallel' is not supported",
        ),
        ({"partition": {"method": "distributed"}}, "spec.partition.method: 'distributed'"),
        ({"placement": {"planFile": "plan.yaml"}}, "spec.placement.planFile: the operator cannot"),
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
    loader (graphrun.job.roles, from the launcher's side of the contract)."""
    roles = pytest.importorskip("graphrun.job.roles")
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
