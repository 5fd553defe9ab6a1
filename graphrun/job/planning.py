"""A GraphJob spec as a placement job, for ``graphrun plan`` and ``graphrun bench placement
--real`` (the job layer may import ``graphrun.placement``; placement itself never sees a
GraphJob).

The conversion, role for role with :func:`graphrun.job.spec.job_roles`:

* one store task ``store:<p>`` per partition (``spec.partition.parts``); its memory is
  the bytes of ``part-<p>/`` when the partition directory (``spec.partition.output``,
  relative to the job file) holds a ``partition.json``, else an estimate from
  ``spec.graph`` (a dataset directory's bytes, or the generator's nodes, degree and
  feature size) split evenly, times :data:`HALO_FACTOR`; plus :data:`STORE_OVERHEAD_GB`
  for the server process. With ``runtime.storeFeatures.storage: disk`` the node features
  (``part-<p>/node/``, a dataset's ``node/``) count as their cache, ``cacheMb``, instead.
  Backups ``store:<p>:<b>`` are not placed on their own: the plan puts them on their main
  server's machine;
* ``trainer:<r>`` for every trainer (``machines * trainersPerMachine``; CPU training,
  no GPU demand). Its ``samplerWorkersPerTrainer`` sampler workers are part of the
  trainer task (their CPU and memory added to its demand): the runtime runs them in
  their trainer's process tree, on its machine, and refuses plans that move them, so
  the planner must not place them apart;
* gradients are synchronised as ``training.sync`` says: allreduce (the runtime's DDP,
  no ``ps:<i>`` roles) or ``ps``, one ``ps:<i>`` task per ``runtime.parameterServers``,
  synchronous or, with ``training.staleness: k``, asynchronous with that staleness
  (the placement job's ``staleness``);
* ``features_cached`` when the node features and labels the trainers read (the
  ``part-<p>/node/*/`` arrays of ``training.feature`` and ``training.label``, all
  partitions together) fit ``runtime.featureCacheMb``: each trainer's cache then holds
  every row it does not read from a co-located store, and no placement moves features
  (the runtime's cache fills its budget with every remote row it can). Without a
  partition directory this is decided from ``spec.graph``'s estimate.

The cluster must have exactly ``spec.runtime.machines`` machines, because a plan's
machines map to the job's by position (:func:`graphrun.job.spec.resolve_placement`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from graphrun.errors import SpecError
from graphrun.job.spec import GraphJob, job_roles
from graphrun.names import RoleName
from graphrun.partition.format import CONFIG_FILE, load_partition_config
from graphrun.placement.cluster import Cluster
from graphrun.placement.job import Demand, Demands, Job, JobSpec, check_size, job_from_spec
from graphrun.placement.plan import PlacementPlan
from graphrun.placement.profile import resolve_profile

GB = 1e9
STORE_OVERHEAD_GB = 1.0  # a store server process beyond the partition it maps
HALO_FACTOR = 1.25  # an estimated partition: its share of the graph plus halo and index
TRAINER = Demand(cpu=4, memory_gb=8)
SAMPLER = Demand(cpu=2, memory_gb=4)


@dataclass(frozen=True)
class GraphJobPlacement:
    """A GraphJob converted for the planner: the placement job, and what the plan of
    that job still needs to be the GraphJob's ``placement.planFile``."""

    job: Job
    machines: int  # spec.runtime.machines
    backups: dict[RoleName, tuple[RoleName, ...]]  # store:<p> -> its backup roles
    samplers: dict[RoleName, tuple[RoleName, ...]]  # trainer:<r> -> its sampler worker roles
    store_memory_from: str  # "partition directory <dir>" or "estimate from spec.graph"

    def check_cluster(self, cluster: Cluster, where: str) -> None:
        if cluster.size != self.machines:
            raise SpecError(
                f"{where}: machines: the cluster has {cluster.size} machines, the GraphJob "
                f"{self.job.source} has {self.machines} (spec.runtime.machines)"
            )
        largest = max(cluster.memory_gb)
        for t in self.job.tasks:
            if t.kind == "store" and t.demand[1] > largest:
                raise SpecError(
                    f"{self.job.source}: {t.role} needs {t.demand[1]:.1f} GB of memory "
                    f"({self.store_memory_from}) and the largest machine of {where} has "
                    f"{largest:g} GB"
                )

    def complete(self, plan: PlacementPlan) -> PlacementPlan:
        """The plan with every store backup on its main server's machine and every
        sampler worker on its trainer's (a sampler worker's demand is part of its trainer's)."""
        out = plan.by_role
        for main, backups in self.backups.items():
            out.update(dict.fromkeys(backups, out[main]))
        for trainer, samplers in self.samplers.items():
            out.update(dict.fromkeys(samplers, out[trainer]))
        return PlacementPlan(
            machines=plan.machines,
            assignments={str(r): m for r, m in out.items()},  # the plan file's role names
            capacity=plan.capacity,
            demands=plan.demands,
        )


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _partition_bytes(
    parts_dir: Path, parts: int, where: str, disk: bool = False
) -> list[float] | None:
    if not (parts_dir / CONFIG_FILE).is_file():
        return None
    num = load_partition_config(parts_dir)["num_parts"]
    if num != parts:
        raise SpecError(
            f"{where}: spec.partition.parts: the job has {parts} partitions, {parts_dir} "
            f"holds {num}"
        )
    sizes = [_dir_bytes(parts_dir / f"part-{p}") for p in range(parts)]
    if disk:  # node features stay in their files
        sizes = [b - _dir_bytes(parts_dir / f"part-{p}" / "node") for p, b in enumerate(sizes)]
    return [float(b) for b in sizes]


def _graph_bytes(gj: GraphJob, base: Path, where: str, disk: bool = False) -> float:
    g = gj.spec.graph
    if g.generator is None:
        data = base / (g.dataset or "")
        if not data.is_dir():
            raise SpecError(
                f"{where}: spec.graph.dataset: {data} does not exist and the partition "
                f"directory {base / gj.partition_dir()} neither, so store memory cannot be "
                "estimated"
            )
        return float(_dir_bytes(data) - (_dir_bytes(data / "node") if disk else 0))
    params = g.generator.params

    def num(key: str, default: float) -> float:
        value = params.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{where}: spec.graph.generator.params.{key}: not a number")
        return float(value)

    nodes = num("nodes", 10_000)
    edges = nodes * num("avgDegree", 20.0)
    # float32 features, label, masks and id maps per node; CSC index, edge ids and id maps
    per_node = (0 if disk else 4 * num("featDim", 64) + 8 + 3) + 16
    return nodes * per_node + edges * (8 + 8 + 16)


def store_memory_gb(gj: GraphJob, base: Path, where: str) -> tuple[list[float], str]:
    """Memory per store task (GB) and where the number came from (see the module doc)."""
    parts = gj.spec.num_parts
    parts_dir = base / gj.partition_dir()
    feats = gj.spec.runtime.store_features
    disk = feats.storage == "disk"
    sizes = _partition_bytes(parts_dir, parts, where, disk)
    source = f"partition directory {parts_dir}"
    if sizes is None:
        sizes = [_graph_bytes(gj, base, where, disk) / parts * HALO_FACTOR] * parts
        source = "estimate from spec.graph"
    cache = feats.cache_mb * 2**20 if disk else 0.0
    return [(b + cache) / GB + STORE_OVERHEAD_GB for b in sizes], source


def _feature_table_bytes(gj: GraphJob, base: Path) -> float | None:
    """Bytes of the node feature and label arrays of every partition (None: no partition
    directory)."""
    parts_dir = base / gj.partition_dir()
    if not (parts_dir / "partition.json").is_file():
        return None
    names = {f"{gj.spec.training.feature}.npy", f"{gj.spec.training.label}.npy"}
    return float(
        sum(
            f.stat().st_size
            for p in range(gj.spec.num_parts)
            for f in (parts_dir / f"part-{p}" / "node").glob("*/*.npy")
            if f.name in names
        )
    )


def features_cached(gj: GraphJob, base: Path, where: str) -> bool:
    """Whether one trainer's feature cache holds the whole graph's features and labels."""
    budget = gj.spec.runtime.feature_cache_mb * 2**20
    table = _feature_table_bytes(gj, base)
    if table is None:
        table = _graph_bytes(gj, base, where)  # everything: an upper bound
    return budget > 0 and table <= budget


def graphjob_to_placement(
    gj: GraphJob, path: Path, profile: str, iterations: int
) -> GraphJobPlacement:
    """The placement job of a GraphJob read from ``path`` (see the module docstring)."""
    where = str(path)
    spec, base = gj.spec, path.parent
    try:  # before anything is read: a job too big to simulate is refused at once
        check_size(spec.num_parts + spec.num_trainers, iterations)
    except ValueError as exc:
        raise SpecError(f"--{exc}") from None
    memory, source = store_memory_gb(gj, base, where)
    workers = spec.runtime.sampler_workers_per_trainer
    trainer = Demand(
        cpu=TRAINER.cpu + workers * SAMPLER.cpu,
        memory_gb=TRAINER.memory_gb + workers * SAMPLER.memory_gb,
    )
    pspec = JobSpec(
        name=gj.name,
        partitions=spec.num_parts,
        trainers=spec.num_trainers,
        samplers_per_trainer=0,  # they are part of their trainer (see the docstring)
        sync="ps" if spec.num_ps else "allreduce",
        parameter_servers=spec.num_ps,
        staleness=spec.training.staleness if spec.num_ps else 0,
        iterations=iterations,
        features_cached=features_cached(gj, base, where),
        profile=profile,
        demands=Demands(
            store=Demand(cpu=2, memory_gb=max(memory)), trainer=trainer, sampler=SAMPLER
        ),
    )
    try:
        prof = resolve_profile(profile)
    except SpecError as exc:
        raise SpecError(f"--profile: {exc}") from exc
    job = job_from_spec(pspec, prof, where)
    tasks = tuple(
        replace(t, demand=(t.demand[0], memory[t.index], t.demand[2])) if t.kind == "store" else t
        for t in job.tasks
    )
    roles = job_roles(spec)
    backups = {
        RoleName.store(p): tuple(
            r.id for r in roles if r.kind == "store" and r.part == p and r.backup
        )
        for p in range(spec.num_parts)
    }
    samplers = {
        RoleName.trainer(t): tuple(r.id for r in roles if r.kind == "sampler" and r.rank == t)
        for t in range(spec.num_trainers)
    }
    wanted = {r.id for r in roles}
    missing = [t.role for t in tasks if t.role not in wanted]
    if missing:  # the two role conventions drifted apart: a bug, not bad input
        raise RuntimeError(f"placement roles {missing} are not roles of the GraphJob")
    return GraphJobPlacement(
        replace(job, tasks=tasks), spec.runtime.machines, backups, samplers, source
    )
