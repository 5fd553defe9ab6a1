"""Pure builders: paths, hosts, role command lines, placement applied, launch plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphrun.errors import SpecError
from graphrun.job.hosts import Hosts
from graphrun.job.spec import parse_job
from graphrun.machine.launch import MachineLaunch, Servers
from graphrun.machine.roles import (
    job_paths,
    job_placement,
    load_job_launch,
    machine_launches,
    machine_name,
    plan_hosts,
)
from graphrun.names import RoleName
from graphrun.wire import convert_json

PY = "/usr/bin/python3"


def make_job(**spec):
    base = {
        "graph": {"dataset": "data"},
        "partition": {"parts": 2, "output": "parts"},
        "runtime": {"machines": 2, "storeServersPerMachine": 2},
        "training": {"task": "node-classification"},
    }
    base.update(spec)
    return parse_job(
        {"apiVersion": "graphrun.io/v1alpha1", "kind": "GraphJob", "metadata": {"name": "j"},
         "spec": base}
    )  # fmt: skip


def test_paths_are_relative_to_the_job_file(tmp_path):
    job = make_job()
    paths = job_paths(job, tmp_path / "sub" / "job.yaml")
    assert paths.dataset == tmp_path / "sub" / "data"
    assert paths.parts == tmp_path / "sub" / "parts"
    assert paths.run_dir == tmp_path / "sub" / "runs" / "j"
    assert paths.checkpoints == paths.run_dir / "checkpoints"


def test_hosts_and_launches_for_co_located_roles(tmp_path):
    job = make_job()
    paths = job_paths(job, tmp_path / "job.yaml")
    roles = job_placement(job, paths)
    hosts = plan_hosts(job, roles, {"m0": "10.0.0.1", "m1": "10.0.0.2"})
    assert hosts.endpoints[RoleName.store(1, 1)].host == "10.0.0.2"
    assert hosts.rendezvous.startswith("10.0.0.1:")  # trainer 0's machine
    ep = hosts.endpoints
    assert hosts.store_endpoints()[0] == [ep[RoleName.store(0)], ep[RoleName.store(0, 1)]]
    launches = machine_launches(job, roles, hosts, paths, resume=True, python=PY)
    m1 = launches[1]
    assert [str(r.role) for r in m1.roles] == ["store:1", "store:1:1", "trainer:1"]
    backup = m1.roles[1].argv
    assert "--backup-of" in backup and f"tcp://{ep[RoleName.store(1)]}" in backup
    assert "--resume" in m1.roles[2].argv
    assert m1.wait_for == (
        Servers(of="partition 0", main=(ep[RoleName.store(0)], ep[RoleName.store(0, 1)])),
        Servers(of="partition 1", main=(ep[RoleName.store(1)], ep[RoleName.store(1, 1)])),
    )
    again = Hosts.read(hosts.write(tmp_path / "hosts.json"))
    assert again == hosts and again.store_endpoints() == hosts.store_endpoints()
    # the file is byte for byte what the hand-written to_dict wrote before the Struct
    old = {"format": "graphrun-hosts", "version": 1,
           "machines": [{"name": m, "address": a} for m, a in hosts.addresses.items()],
           "endpoints": {str(r): str(e) for r, e in ep.items()},
           "rendezvous": hosts.rendezvous}  # fmt: skip
    assert (tmp_path / "hosts.json").read_text() == json.dumps(old, indent=2) + "\n"


def test_a_replica_runs_on_the_next_machine_with_its_primary_s_address(tmp_path):
    job = make_job(runtime={"machines": 2, "storeServersPerMachine": 2, "replicas": 2})
    paths = job_paths(job, tmp_path / "job.yaml")
    roles = job_placement(job, paths)
    hosts = plan_hosts(job, roles, {"m0": "10.0.0.1", "m1": "10.0.0.2"})
    ep = {str(r): e for r, e in hosts.endpoints.items()}
    assert ep["store:0:r"].host == "10.0.0.2" and ep["store:1:r"].host == "10.0.0.1"
    assert hosts.store_endpoints()[0] == [ep["store:0"], ep["store:0:1"], ep["store:0:r"]]
    m1 = machine_launches(job, roles, hosts, paths, python=PY)[1]
    assert [str(r.role) for r in m1.roles] == ["store:1", "store:1:1", "store:0:r", "trainer:1"]
    argv = m1.roles[2].argv
    assert argv[argv.index("--replica-of") + 1] == f"tcp://{ep['store:0']}"
    assert argv[argv.index("--part") + 1] == "0" and "--backup-of" not in argv
    # every machine waits for each partition's servers, a replica able to stand in for
    # its dead primary
    assert m1.wait_for == tuple(
        Servers(of=f"partition {p}", main=(ep[f"store:{p}"], ep[f"store:{p}:1"]),
                replicas=(ep[f"store:{p}:r"],))
        for p in (0, 1)
    )  # fmt: skip


def test_every_store_server_of_a_disk_features_job_serves_from_disk(tmp_path):
    feats = {"storage": "disk", "cacheMb": 64}
    job = make_job(runtime={"machines": 2, "storeServersPerMachine": 2, "replicas": 2,
                            "storeFeatures": feats})  # fmt: skip
    paths = job_paths(job, tmp_path / "job.yaml")
    roles = job_placement(job, paths)
    hosts = plan_hosts(job, roles, {"m0": "10.0.0.1", "m1": "10.0.0.2"})
    stores = [r for m in machine_launches(job, roles, hosts, paths, python=PY) for r in m.roles
              if r.role.kind == "store"]  # fmt: skip
    assert len(stores) == 6  # main, backup and replica of each partition
    for r in stores:
        argv = list(r.argv)
        assert argv[argv.index("--features") + 1] == "disk"
        assert argv[argv.index("--disk-cache-mb") + 1] == "64"
    plain = make_job()
    roles = job_placement(plain, paths)
    launches = machine_launches(plain, roles, plan_hosts(plain, roles), paths, python=PY)
    assert all("--features" not in r.argv for m in launches for r in m.roles)


def test_a_hosts_file_with_an_endpoint_of_no_role_is_refused_naming_it():
    endpoints = {"store:0": "10.0.0.1:1", "stor:1": "10.0.0.1:2"}
    data = {"format": "graphrun-hosts", "version": 1, "endpoints": endpoints,
            "machines": [{"name": "m0", "address": "10.0.0.1"}]}  # fmt: skip
    with pytest.raises(SpecError, match=r"hosts.json: endpoints: 'stor:1' is not a role"):
        convert_json(Hosts, data, "hosts.json")


def test_placement_plan_moves_roles(tmp_path):
    job = make_job(placement={"assignments": {"trainer:0": "m1", "store:1": "m0"}},
                   runtime={"machines": 2})  # fmt: skip
    paths = job_paths(job, tmp_path / "job.yaml")
    launches = machine_launches(job, job_placement(job, paths), plan_hosts(job, job_placement(
        job, paths)), paths, python=PY)  # fmt: skip
    assert [str(r.role) for r in launches[0].roles] == ["store:0", "store:1"]
    assert [str(r.role) for r in launches[1].roles] == ["trainer:0", "trainer:1"]


def test_launch_plan_round_trips_through_json(tmp_path):
    job = make_job()
    paths = job_paths(job, tmp_path / "job.yaml")
    roles = job_placement(job, paths)
    launch = machine_launches(job, roles, plan_hosts(job, roles), paths, python=PY)[0]
    assert MachineLaunch.read(launch.write(tmp_path / "m0.json")) == launch
    # the file's layout, version 2: what a machine waits for, per partition
    waits = [{"of": s.of, "main": list(map(str, s.main)), "replicas": list(map(str, s.replicas))}
             for s in launch.wait_for]  # fmt: skip
    old = {"format": "graphrun-launch", "version": 2, "machine": launch.machine, "wait_for": waits,
           "ready_timeout_s": launch.ready_timeout_s, "key_file": launch.key_file,
           "stall_timeout_s": launch.stall_timeout_s,
           "replicated": list(map(str, launch.replicated)),
           "elastic": launch.elastic, "live_dirs": list(launch.live_dirs),
           "roles": [{"kind": r.kind, "role": str(r.role), "argv": list(r.argv), "env": dict(r.env),
                      "cwd": r.cwd, "ready": r.ready and str(r.ready)}
                     for r in launch.roles]}  # fmt: skip
    assert (tmp_path / "m0.json").read_text() == json.dumps(old, indent=2) + "\n"
    bad = json.loads((tmp_path / "m0.json").read_text())
    bad["roles"][0]["kind"] = "painter"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(
        SpecError, match=r"bad\.json: roles\[0\]\.kind: Invalid enum value 'painter'"
    ):
        MachineLaunch.read(tmp_path / "bad.json")


def test_worker_builds_the_same_launch_from_the_job(tmp_path):
    job = make_job()
    job_file = tmp_path / "job.yaml"
    job_file.write_text(json.dumps(job.to_dict()))
    paths = job_paths(job, job_file)
    roles = job_placement(job, paths)
    hosts = plan_hosts(job, roles)
    hosts_file = hosts.write(tmp_path / "hosts.json")
    mine = machine_launches(job, roles, hosts, paths, python=PY)[1]
    again = load_job_launch(job_file, "1", hosts_file, paths.keys_dir, python=PY)
    assert again.roles[0].argv == mine.roles[0].argv
    assert again.wait_for == mine.wait_for


def test_machine_names_and_bad_hosts_files(tmp_path):
    job = make_job()
    assert machine_name(job, "1") == "m1" and machine_name(job, "m0") == "m0"
    with pytest.raises(SpecError, match="--machine"):
        machine_name(job, "m7")
    bad = tmp_path / "hosts.json"
    bad.write_text('{"format": "graphrun-hosts", "version": 1, "machines": [], '
                   '"endpoints": {"store:0": "nohost"}}')  # fmt: skip
    with pytest.raises(SpecError, match=r"json: endpoints\[\.\.\.\]: 'nohost' is not host:port"):
        Hosts.read(bad)
    with pytest.raises(SpecError, match=r"missing\.json: missing \(the hosts file\)"):
        Hosts.read(Path(tmp_path / "missing.json"))
    latin = tmp_path / "latin.json"
    latin.write_bytes(b"\xff\xfe{")
    with pytest.raises(SpecError, match=r"latin\.json: not valid JSON"):
        Hosts.read(latin)


def test_trainer_threads_share_the_machine_with_its_other_roles():
    from graphrun.machine.trainer import default_threads

    job = make_job()  # one trainer and store:P + store:P:1 per machine
    per = 1 + job.spec.runtime.store_servers_per_machine
    assert default_threads(job, cores=2) == 1  # torch's default was 2: oversubscribed
    assert default_threads(job, cores=32) == 32 // per
    assert default_threads(job, cores=32, machines=2) == 32 // (2 * per)  # a local job
    on_store = make_job(graph={"store": {"addresses": ["tcp://h:1", "tcp://h:2"],
                                         "keyFile": "k"}})  # fmt: skip
    assert default_threads(on_store, cores=32) == 32  # a running store is not on our machines


def test_free_ports_are_outside_the_ephemeral_range() -> None:
    """A port from the ephemeral range can be taken by any outgoing connection between
    the check and the server's bind ("Address already in use" in a job's first attempt)."""
    from graphrun.job.hosts import _ephemeral_range, free_ports

    low, high = _ephemeral_range()
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(1024 <= p < low for p in ports), (low, high, ports)


def _store_args(launches: list[MachineLaunch]) -> dict[str, list[str]]:
    return {str(r.role): list(r.argv) for m in launches for r in m.roles if r.kind == "store"}


def test_a_live_job_s_store_servers_log_to_a_directory_per_partition(tmp_path):
    """spec.live: every main server and replica of partition p gets --live-dir
    RUN/live/p (or live.logDir/p), made by its machine's worker; a backup none (its main
    logs); a job that does not follow a live graph none."""
    runtime = {"machines": 2, "storeServersPerMachine": 2, "replicas": 2}
    job = make_job(runtime=runtime, live={})
    paths = job_paths(job, tmp_path / "job.yaml")
    roles = job_placement(job, paths)
    launches = machine_launches(job, roles, plan_hosts(job, roles), paths, python=PY)
    args = _store_args(launches)
    live = paths.run_dir / "live"
    for role, part in (("store:0", 0), ("store:1", 1), ("store:0:r", 0), ("store:1:r", 1)):
        argv = args[role]
        assert argv[argv.index("--live-dir") + 1] == str(live / str(part)), role
    assert "--live-dir" not in args["store:0:1"]  # a backup
    assert launches[1].live_dirs == (str(live / "0"), str(live / "1"))  # store:1, store:0:r
    assert MachineLaunch.read(launches[1].write(tmp_path / "m1.json")) == launches[1]
    for log_dir, where in (("logs", tmp_path / "logs"), ("/var/lib/g", Path("/var/lib/g"))):
        job = make_job(runtime=runtime, live={"logDir": log_dir})
        launch = machine_launches(job, roles, plan_hosts(job, roles),
                                  job_paths(job, tmp_path / "job.yaml"), python=PY)[0]  # fmt: skip
        argv = _store_args([launch])["store:0"]
        assert argv[argv.index("--live-dir") + 1] == str(where / "0")
    plain = make_job(runtime=runtime)
    paths = job_paths(plain, tmp_path / "job.yaml")
    launches = machine_launches(plain, roles, plan_hosts(plain, roles), paths, python=PY)
    assert not any("--live-dir" in a for a in _store_args(launches).values())
    assert all(m.live_dirs == () for m in launches)


def test_a_live_job_s_other_partitions_are_told_where_the_sequencer_serves(tmp_path):
    """A piece a restarted store replays pending asks the sequencer its fate: every
    store of partitions other than 0 (primary and replica) is given partition 0's
    primary's address and its replicas' in this attempt (--sequencer, in that order);
    partition 0's own stores hold it and get none, nor does a store without a log."""
    runtime = {"machines": 2, "replicas": 2}
    job = make_job(runtime=runtime, live={})
    paths = job_paths(job, tmp_path / "job.yaml")
    roles = job_placement(job, paths)
    hosts = plan_hosts(job, roles, {"m0": "10.0.0.1", "m1": "10.0.0.2"})
    ep = {str(r): f"tcp://{e}" for r, e in hosts.endpoints.items()}
    args = _store_args(machine_launches(job, roles, hosts, paths, python=PY))

    def told(argv: list[str]) -> list[str]:
        return [argv[i + 1] for i, a in enumerate(argv) if a == "--sequencer"]

    for role in ("store:1", "store:1:r"):
        assert told(args[role]) == [ep["store:0"], ep["store:0:r"]], role
    assert told(args["store:0"]) == told(args["store:0:r"]) == []
    plain = make_job(runtime=runtime)
    paths = job_paths(plain, tmp_path / "job.yaml")
    launches = machine_launches(plain, roles, plan_hosts(plain, roles), paths, python=PY)
    assert not any("--sequencer" in a for a in _store_args(launches).values())
