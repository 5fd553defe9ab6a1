"""From a GraphJob to processes: pure builders of hosts, paths and role command lines.

Relative paths in a job (dataset, partition output, checkpoint dir, script, plan
file) are taken relative to the directory of the job file, so a job behaves the
same whatever directory ``graphrun run`` is started from. A job's working files
live in its run directory (default ``<job dir>/runs/<name>``)::

    RUN/hosts.json      the hosts file (graphrun.job.hosts)
    RUN/keys/job.key    the job's secret (every store message is signed with it)
    RUN/data/           the generated dataset (jobs with graph.generator)
    RUN/launch/<m>.json what machine <m> runs (graphrun.machine.launch)
    RUN/status/<m>.json machine <m>'s state and role exit codes (graphrun.machine.worker)
    RUN/logs/<m>/<role>.log
    RUN/checkpoints/    unless training.checkpointDir says otherwise
    RUN/live/<p>/       partition p's store logs (--live-dir) with spec.live, unless
                        live.logDir says otherwise
    RUN/state.json      the job's workflow state (phase, conditions)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from graphrun.errors import SpecError
from graphrun.job.hosts import Hosts, build_hosts, free_ports
from graphrun.job.spec import (
    GraphJob,
    Role,
    StoreFeatures,
    job_roles,
    load_job,
    resolve_placement,
)
from graphrun.machine.launch import MachineLaunch, RoleLaunch, Servers
from graphrun.names import Endpoint, RoleName

NETNS_BASE_PORT = 30000


@dataclass(frozen=True)
class JobPaths:
    job_file: Path
    base_dir: Path
    run_dir: Path
    dataset: Path
    parts: Path
    checkpoints: Path
    hosts_file: Path
    keys_dir: Path
    live: Path | None = None  # the store servers' logs, a directory per partition

    def live_dir(self, part: int | None) -> Path | None:
        """Partition ``part``'s log directory (its primary's and replicas' logs)."""
        return self.live / str(part) if self.live is not None and part is not None else None

    @property
    def key_file(self) -> Path:
        return self.keys_dir / "job.key"

    @property
    def state_file(self) -> Path:
        return self.run_dir / "state.json"


def store_key_file(job: GraphJob, paths: JobPaths) -> Path | None:
    """The key file of the running store a job uses (``graph.store``), else None."""
    ref = job.spec.graph.store
    if ref is None:
        return None
    if ref.key_file is None:
        raise SpecError(f"{paths.job_file}: spec.graph.store.keyFile: required by graphrun run")
    return paths.base_dir / ref.key_file


def job_paths(job: GraphJob, job_file: Path, run_dir: Path | None = None) -> JobPaths:
    base = Path(job_file).resolve().parent
    run = Path(run_dir).resolve() if run_dir is not None else base / "runs" / job.name
    g = job.spec.graph
    dataset = base / g.dataset if g.dataset is not None else run / "data"
    ckpt = job.spec.training.checkpoint_dir
    live = job.spec.live if job.spec.graph.store is None else None
    return JobPaths(
        job_file=Path(job_file).resolve(),
        base_dir=base,
        run_dir=run,
        dataset=dataset,
        parts=base / job.partition_dir(),
        checkpoints=base / ckpt if ckpt else run / "checkpoints",
        hosts_file=run / "hosts.json",
        keys_dir=run / "keys",
        live=(base / live.log_dir if live.log_dir else run / "live") if live else None,
    )


def job_placement(job: GraphJob, paths: JobPaths) -> dict[RoleName, Role]:
    """Every role of the job with the machine the placement (plan) gives it."""
    where = resolve_placement(job, paths.base_dir)
    return {role.id: Role(role.id, where[role.id]) for role in job_roles(job.spec)}


def plan_hosts(
    job: GraphJob, roles: Mapping[RoleName, Role], addresses: Mapping[str, str] | None = None
) -> Hosts:
    """Addresses and ports: loopback with free ports, or given machine addresses (netns)."""
    machines = job.spec.machine_names
    listening = [r.id for r in roles.values() if r.kind in ("store", "ps")]
    if addresses is None:
        addr = dict.fromkeys(machines, "127.0.0.1")
        ports = free_ports(len(listening) + 1)
    else:
        addr = {m: addresses[m] for m in machines}
        ports = [NETNS_BASE_PORT + i for i in range(len(listening) + 1)]
    store = job.spec.graph.store.addresses if job.spec.graph.store is not None else ()
    placement = {role: r.machine for role, r in roles.items()}
    return build_hosts(addr, placement, listening, ports, store)


def store_argv(
    role: Role,
    hosts: Hosts,
    paths: JobPaths,
    python: str,
    profile: Path | None = None,
    features: StoreFeatures | None = None,
) -> tuple[str, ...]:
    """``graphrun serve``: the main server of a partition, one of its backups, or its
    replica on another machine."""
    host, port = hosts.endpoint(role.id)
    argv = [
        python, "-m", "graphrun", "serve", str(paths.parts), "--part", str(role.part),
        "--address", f"tcp://{host}:{port}", "--key-file", str(paths.key_file),
    ]  # fmt: skip
    if role.backup:
        mhost, mport = hosts.endpoint(RoleName.store(role.id.index))
        argv += ["--backup-of", f"tcp://{mhost}:{mport}", "--backup-index", str(role.backup)]
    if role.id.replica:  # loads the partition itself and takes its primary's writes
        phost, pport = hosts.endpoint(RoleName.store(role.id.index))
        argv += ["--replica-of", f"tcp://{phost}:{pport}"]
        argv += ["--replica-index", str(role.id.replica)]
    live = paths.live_dir(role.part)
    if live is not None and not role.backup:  # a backup's main logs
        argv += ["--live-dir", str(live)]
        argv += [a for ep in _sequencer(role, hosts) for a in ("--sequencer", ep)]
    if profile is not None:
        argv += ["--profile", str(profile)]
    argv += features.serve_args() if features is not None else []
    return tuple(argv)


def _sequencer(role: Role, hosts: Hosts) -> list[str]:
    """Where the live graph's sequencer serves in this attempt (partition 0's primary,
    then its replicas), for the other partitions' stores: a piece a log replays pending
    asks its fate there (a restarted job's stores may listen on new ports). Partition
    0's own stores hold the sequencer (or its copy) and ask no one."""
    if role.part == 0:
        return []
    eps = [hosts.endpoints[RoleName.store(0)], *hosts.replica_endpoints().get(0, [])]
    return [f"tcp://{ep}" for ep in eps]  # a trainer's addresses so too (machine/trainer.py)


def ps_argv(
    role: Role, hosts: Hosts, paths: JobPaths, python: str, profile: Path | None = None
) -> tuple[str, ...]:
    """``graphrun ps``: parameter server ``ps:J`` of the job, with the job's key."""
    host, port = hosts.endpoint(role.id)
    argv = (
        python, "-m", "graphrun", "ps", "--index", str(role.id.index),
        "--address", f"tcp://{host}:{port}", "--key-file", str(paths.key_file),
    )  # fmt: skip
    return (*argv, "--profile", str(profile)) if profile is not None else argv


def trainer_argv(
    role: Role,
    paths: JobPaths,
    python: str,
    resume: bool,
    profile: Path | None,
    extra: Sequence[str] = (),
) -> tuple[str, ...]:
    argv = [
        python, "-m", "graphrun.machine.trainer",
        "--job", str(paths.job_file), "--rank", str(role.rank),
        "--hosts-file", str(paths.hosts_file), "--keys", str(paths.keys_dir),
        "--run-dir", str(paths.run_dir), "--machine", role.machine,
    ]  # fmt: skip
    if resume:
        argv.append("--resume")
    if profile is not None:
        argv += ["--profile", str(profile)]
    return (*argv, *extra)


def trainer_gpu(job: GraphJob, roles: Mapping[RoleName, Role], role: Role) -> int | None:
    """The machine's GPU a trainer is pinned to: its local rank (its place among the
    machine's trainers, by rank) modulo ``runtime.gpusPerMachine``; None for CPU jobs."""
    gpus = job.spec.runtime.machine_gpus
    if gpus <= 0:
        return None
    ranks = sorted(
        r.id.index for r in roles.values() if r.kind == "trainer" and r.machine == role.machine
    )
    return ranks.index(role.id.index) % gpus


def machine_launches(
    job: GraphJob,
    roles: Mapping[RoleName, Role],
    hosts: Hosts,
    paths: JobPaths,
    resume: bool = False,
    python: str = sys.executable,
    profile_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 120.0,
    trainer_args: Sequence[str] = (),
) -> list[MachineLaunch]:
    """What every machine runs, in machine order."""
    env = dict(env or {})
    all_stores = servers_of_the_job(roles, hosts)
    out = []
    for m in job.spec.machine_names:
        launches: list[RoleLaunch] = []
        for r in roles.values():
            if r.machine != m:
                continue
            if r.kind == "store":
                name = r.name.replace(":", "-")  # store-0, store-0-1 (backup), store-0-r
                prof = profile_dir / f"{name}.jsonl" if profile_dir else None
                feats = job.spec.runtime.store_features
                argv = store_argv(r, hosts, paths, python, prof, feats)
                launches.append(RoleLaunch.of("store", r.id, argv, env, hosts.endpoints[r.id]))
            elif r.kind == "ps":
                prof = profile_dir / f"ps-{r.id.index}.jsonl" if profile_dir else None
                argv = ps_argv(r, hosts, paths, python, prof)
                launches.append(RoleLaunch.of("ps", r.id, argv, env, hosts.endpoints[r.id]))
            elif r.kind == "trainer":
                prof = profile_dir / f"trainer-{r.rank}.jsonl" if profile_dir else None
                argv = trainer_argv(r, paths, python, resume, prof, trainer_args)
                gpu = trainer_gpu(job, roles, r)
                if gpu is not None:
                    argv = (*argv, "--gpu", str(gpu))
                launches.append(RoleLaunch.of("trainer", r.id, argv, env))
            # sampler:<rank>:<w> roles run inside their trainer's data loader (worker
            # processes it starts and stops); they are not separate launches yet.
        key = str(paths.key_file)
        replicated = tuple(
            r.role for r in launches if r.kind == "store" and job.spec.runtime.replicas > 1
        )
        live = {paths.live_dir(roles[r.role].part) for r in launches if r.kind == "store"}
        out.append(
            MachineLaunch(
                machine=m,
                roles=tuple(launches),
                wait_for=all_stores,
                ready_timeout_s=ready_timeout_s,
                key_file=key,
                replicated=replicated,
                elastic=job.spec.runtime.elastic is not None,
                live_dirs=tuple(sorted(str(d) for d in live if d is not None)),
            )
        )
    return out


def servers_of_the_job(roles: Mapping[RoleName, Role], hosts: Hosts) -> tuple[Servers, ...]:
    """What every machine waits for before its trainers start: each partition's store
    servers (main, backups, replicas: a replica stands in for a dead primary,
    :class:`~graphrun.machine.launch.Servers`) and each parameter server."""
    main: dict[int, list[Endpoint]] = {}
    copies: dict[int, list[Endpoint]] = {}
    for name, ep in sorted(hosts.endpoints.items()):  # main before backups, replicas in order
        if name.kind == "store":
            (copies if name.replica else main).setdefault(name.index, []).append(ep)
    out = [
        Servers(of=f"partition {p}", main=tuple(eps), replicas=tuple(copies.get(p, ())))
        for p, eps in sorted(main.items())
    ]
    ps = sorted(r.id for r in roles.values() if r.kind == "ps")
    return (*out, *(Servers(of=str(r), main=(hosts.endpoints[r],)) for r in ps))


def machine_name(job: GraphJob, machine: str) -> str:
    """A machine given by index (``0``) or name (``m0``) -> its name."""
    names = job.spec.machine_names
    if machine in names:
        return machine
    if machine.isdigit() and int(machine) < len(names):
        return names[int(machine)]
    raise SpecError(f"--machine: {machine!r} is not a machine of the job ({', '.join(names)})")


def load_job_launch(
    job_file: Path,
    machine: str,
    hosts_file: Path,
    keys_dir: Path | None,
    resume: bool = False,
    run_dir: Path | None = None,
    python: str = sys.executable,
) -> MachineLaunch:
    """The launch of one machine, as ``graphrun worker --job`` needs it."""
    job = load_job(job_file)
    hosts = Hosts.read(hosts_file)
    paths = replace(job_paths(job, job_file, run_dir), hosts_file=Path(hosts_file).resolve())
    if keys_dir is not None:
        paths = replace(paths, keys_dir=Path(keys_dir).resolve())
    name = machine_name(job, machine)
    roles = job_placement(job, paths)
    launches = machine_launches(job, roles, hosts, paths, resume, python)
    return next(m for m in launches if m.machine == name)


def roles_of_kind(roles: Mapping[RoleName, Role], kind: str) -> Sequence[Role]:
    return [r for r in roles.values() if r.kind == kind]
