"""The trainer role: ``python -m graphrun.machine.trainer --job JOB --rank R --hosts-file F ...``.

The edge where a trainer process turns its command line, the job spec and the hosts
file into typed values (:class:`~graphrun.train.config.TrainConfig`, the store
client, :class:`~graphrun.train.ddp.DDPConfig`) and hands them to
:func:`graphrun.train.loop.run_training`. Nothing below reads the environment.

Trainer ``r`` of ``W`` trains on partition ``r * P // W`` (co-located placement puts
it on that partition's machine; a placement plan may move it elsewhere).

``training.script`` jobs: the script is run as a module named ``__graphrun__`` and
its ``main(ctx)`` is called with the same context a built-in task gets.
``training.entryPoint`` modules are imported from the job file's directory first, then
from the installed packages (as ``python script.py`` puts the script's directory first).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import runpy
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from graphrun.errors import (
    SUSPENDED_EXIT,
    USER_ERROR_EXIT,
    ArgumentError,
    GraphrunError,
    Suspended,
    UserError,
)
from graphrun.job.hosts import Hosts
from graphrun.job.spec import GraphJob, TrainingSpec, load_job
from graphrun.machine.roles import job_paths
from graphrun.names import RoleName
from graphrun.record import Joined, Traffic, emit
from graphrun.train.config import ElasticConfig, TrainConfig


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="graphrun-trainer", description=__doc__)
    p.add_argument("--job", type=Path, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--hosts-file", type=Path, required=True)
    p.add_argument("--keys", type=Path, required=True, help="directory with job.key")
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--machine", default="", help="the job's name for this machine")
    p.add_argument("--resume", action="store_true")
    p.add_argument(
        "--join",
        action="store_true",
        help="come into the running trainers' group at their next epoch boundary (a machine "
        "back after its loss, runtime.elastic; docs/elastic.md)",
    )
    p.add_argument("--profile", type=Path, help="append per-batch records (JSON lines) here")
    p.add_argument("--aggr", choices=("scatter", "csr"), default="csr")
    p.add_argument("--timeout", type=float, default=300.0, help="rendezvous timeout (s)")
    p.add_argument(
        "--threads", type=int, help="torch intra-op threads (default: default_threads(job))"
    )
    p.add_argument(
        "--gpu", type=int, help="compute on this GPU of the machine (its local rank; docs/gpu.md)"
    )
    p.add_argument(
        "--device-feed",
        choices=("auto", "cpu"),
        default="auto",
        help="cpu: a CPU trainer takes the GPU feature path with its CPU transfer (tests)",
    )
    p.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        help="torch.distributed backend (default: nccl on a GPU, gloo on CPU; gloo where "
        "trainers share one GPU)",
    )
    return p.parse_args(argv)


# what the trainer's config takes from the spec's training section as it is: every
# field of both, but these (the spec's form of them is not the trainer's)
_OWN = frozenset({"entry_point", "args", "fanouts", "checkpoint_dir"})
SPEC_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(TrainConfig)
    if f.name in TrainingSpec.model_fields and f.name not in _OWN
)


def train_config(job: GraphJob, args: argparse.Namespace, run_dir: Path, ckpt: Path) -> TrainConfig:
    """The trainer's config: the spec's training section (:data:`SPEC_FIELDS` as they
    are), then what this trainer's command line, the runtime and the run add."""
    t = job.spec.training
    return TrainConfig(
        **{name: getattr(t, name) for name in SPEC_FIELDS},
        entry_point=t.entry_point or ("__script__" if t.script else None),
        args=tuple(t.args),
        fanouts=t.normalized_fanouts,
        aggr_path=args.aggr,
        gpu_cache_mb=job.spec.runtime.gpu_feature_cache_mb,
        feed=args.device_feed,
        checkpoint_dir=ckpt,
        resume=args.resume,
        metrics_file=run_dir / "metrics.jsonl",
        profile_file=args.profile,
        tensorboard_dir=run_dir / "tensorboard" if t.tensorboard else None,
        machines=trainer_machines(job, args.job),
        elastic=elastic_config(job),
    )


def elastic_config(job: GraphJob) -> ElasticConfig | None:
    """``runtime.elastic`` as the trainer loop takes it (None: a lost machine fails the
    attempt)."""
    e = job.spec.runtime.elastic
    if e is None:
        return None
    return ElasticConfig(min_machines=e.min_machines, timeout_s=e.timeout_seconds)


def store_timeout(job: GraphJob) -> float:
    """How long a trainer's store request waits before it fails over to a replica: 30 s,
    and in an elastic job no longer than ``runtime.elastic.timeoutSeconds`` (a survivor
    stuck on a stopped or cut-off machine's store must come to the re-form in time) but
    at least 10 s (a write waits up to 5 s for a silent replica, store/replicas.py)."""
    e = job.spec.runtime.elastic
    return 30.0 if e is None else min(30.0, max(10.0, e.timeout_seconds))


def trainer_machines(job: GraphJob, job_file: Path) -> tuple[str, ...]:
    """The machine of each trainer rank, as the job's placement gives it."""
    from graphrun.machine.roles import job_placement

    roles = job_placement(job, job_paths(job, job_file))
    return tuple(roles[RoleName.trainer(r)].machine for r in range(job.spec.num_trainers))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from graphrun.distributed import DistGraph, initialize
    from graphrun.names import home_partition
    from graphrun.rpc.auth import load_keys
    from graphrun.rpc.tuning import keep_large_allocations
    from graphrun.train.ddp import DDPConfig
    from graphrun.train.distdata import DistGraphData
    from graphrun.train.loop import run_training
    from graphrun.train.suspend import StopFlag

    stop = StopFlag().install()  # first: a SIGTERM from now on is a request to checkpoint

    keep_large_allocations()  # mini-batches and pulled features are fresh buffers of MBs
    job = load_job(args.job)
    if job.spec.runtime.sampler_workers_per_trainer and args.gpu is None:
        from graphrun.distributed.workers import fork_server_now

        fork_server_now()  # forked now, while no thread of torch, zmq or gloo runs
    import torch

    torch.set_num_threads(args.threads or default_threads(job))
    accelerator = trainer_device(job, args)
    paths = job_paths(job, args.job, args.run_dir)
    hosts = Hosts.read(args.hosts_file)
    world, parts = job.spec.num_trainers, job.spec.num_parts
    if not 0 <= args.rank < world:
        raise ArgumentError(f"--rank: {args.rank} is not in [0, {world})")
    cfg = train_config(job, args, paths.run_dir, paths.checkpoints)
    if cfg.elastic is not None:  # probed when the group re-forms: is it this one cut off?
        cfg = replace(cfg, elastic=replace(cfg.elastic, probes=tuple(hosts.probes().items())))
    if cfg.entry_point == "__script__":
        cfg = _script_entry(cfg, paths.base_dir / str(job.spec.training.script))
    elif cfg.entry_point is not None:
        sys.path.insert(0, str(paths.base_dir))  # the user's modules beside the job file
    servers = [f"tcp://{eps[0]}" for _, eps in sorted(hosts.store_endpoints().items())]
    keys = load_keys(args.keys / "job.key")
    copies = hosts.replica_endpoints()  # joined in its place when a primary is gone
    replicas = tuple(tuple(f"tcp://{e}" for e in copies.get(p, ())) for p in range(parts))
    ctx = initialize(
        servers, job=job.name, keys=keys, rank=args.rank,
        world_size=world, partition=home_partition(args.rank, world, parts),
        name=str(RoleName.trainer(args.rank)), machine=args.machine, replicas=replicas,
        timeout=store_timeout(job),
    )  # fmt: skip
    local = ctx.client.local_parts  # partitions read through shared memory (co-located)
    emit(Joined(rank=args.rank, local_parts=list(local)))
    workers = job.spec.runtime.sampler_workers_per_trainer
    cache_mb = job.spec.runtime.feature_cache_mb
    follow = job.spec.live.follow if job.spec.live is not None else None
    data = DistGraphData(
        DistGraph(ctx, follow=follow), args.rank, world, workers, seed=cfg.seed, cache_mb=cache_mb
    )
    try:
        # a TCP rendezvous (machines apart) is the job key's CURVE store, not torch's
        ddp = DDPConfig(
            args.rank, world, hosts.rendezvous, backend=args.backend, timeout_s=args.timeout,
            keys=keys, accelerator=accelerator, serve_rendezvous=not hosts.rendezvous_external,
        )  # fmt: skip
        # the job's own store servers are stopped by trainer 0 once all trainers finished;
        # a running store the job joined (graph.store) is shared and keeps serving
        own = job.spec.graph.store is None
        ps = ps_settings(job, hosts, keys, args.timeout)

        def done() -> None:
            if ps is not None:
                from graphrun.store.ps_client import stop_parameter_servers

                stop_parameter_servers(ps.addresses, ps.keys)
            if own:
                ctx.client.session.stop_servers()

        def finished(rank: int) -> None:
            # every session leaves (the loader workers' too) or stops its heartbeats before
            # trainer 0 stops the stores: a job that succeeded ended with one "heartbeat ...
            # connection lost" warning per worker and store (``rank``: in the group the
            # trainers ended in, which an elastic job may have re-formed)
            data.close()
            if rank == 0 and own:
                ctx.client.session.stop_heartbeat()  # it still needs its connections to stop them
            else:
                ctx.close()

        run_training(
            cfg,
            data,
            ddp,
            graph=data.graph,
            on_done=done,
            on_finished=finished,
            stop=stop,
            ps=ps,
            join=args.join,
        )
        emit(Traffic(rank=args.rank, received=traffic(ctx.client)))
    finally:
        data.close()
        ctx.close()
    return 0


def trainer_device(job: GraphJob, args: argparse.Namespace) -> str:
    """``"cpu"``, or ``"cuda:<gpu>"`` for ``--gpu``, after checking that this machine
    has the GPUs the job asks for (one line naming it and what it has, before any work)."""
    if args.gpu is None:
        return "cpu"
    import torch

    from graphrun.train.device import check_gpus, cuda_count

    have = cuda_count()
    names = [torch.cuda.get_device_name(i) for i in range(have)]
    r = job.spec.runtime
    check_gpus(args.machine, max(r.machine_gpus, args.gpu + 1), have, names, r.gpus_field)
    torch.cuda.set_device(args.gpu)
    return f"cuda:{args.gpu}"


def ps_settings(job: GraphJob, hosts: Hosts, keys: Any, timeout_s: float) -> Any:
    """The parameter servers of a ``training.sync: ps`` job (None for allreduce):
    ``ps:J``'s endpoint from the hosts file, the job's key, the mode."""
    n = job.spec.num_ps
    if n == 0:
        return None
    from graphrun.train.ps import PSSettings

    t = job.spec.training
    addresses = []
    for j in range(n):
        host, port = hosts.endpoint(RoleName.ps(j))
        addresses.append(f"tcp://{host}:{port}")
    mode: Literal["sync", "async"] = "async" if t.staleness else "sync"
    return PSSettings(tuple(addresses), keys, mode, t.staleness, timeout_s)


def default_threads(job: GraphJob, cores: int | None = None, machines: int = 1) -> int:
    """A trainer's torch intra-op threads: the cores shared by the processes the job puts
    on ``machines`` of its machines (its trainers and store servers), at least one: one
    machine's on a cluster, every machine's in a local job (all on one host). torch's own
    default, every core, oversubscribes a machine that also runs a store server (one thread
    per trainer made the epoch shorter: benchmarks/README.md, "threads"); and a thread
    more than its share spins in OpenMP's barriers while the other processes have the
    cores (a step's CPU time grew up to 20 times)."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
    rt = job.spec.runtime
    stores = rt.store_servers_per_machine if job.spec.graph.store is None else 0
    return max(1, cores // (machines * (rt.trainers_per_machine + stores)))


def traffic(client: Any) -> dict[str, dict[str, int]]:
    """Bytes this trainer's client got from the servers of each partition, by operation
    (its sampler workers, if any, have their own clients)."""
    received: dict[str, dict[str, int]] = {}
    for (part, op), n in sorted(client.traffic.items()):
        if not op.endswith(":shm"):
            received.setdefault(str(part), {})[op] = n
    return received


def _script_entry(cfg: Any, script: Path) -> Any:
    """Run the user's script as a module and use its ``main(ctx)`` as the entry point."""
    import dataclasses

    if not script.is_file():
        raise ArgumentError(f"spec.training.script: {script} does not exist")
    namespace = runpy.run_path(str(script), run_name="__graphrun__")
    fn = namespace.get("main")
    if not callable(fn):
        raise ArgumentError(f"spec.training.script: {script} defines no main(ctx)")
    module = type(sys)("graphrun_user_script")
    module.main = fn  # type: ignore[attr-defined]
    sys.modules["graphrun_user_script"] = module
    return dataclasses.replace(cfg, entry_point="graphrun_user_script:main")


def run_main(argv: Sequence[str] | None = None) -> int:
    """:func:`main`'s exit code, its errors said on stderr: one line for a user error
    (exit 2, no restart will help), the line and a traceback for any other error (exit 1,
    as Python's own). The exception and its frames are gone when this returns, so what
    they held (a user's open file) is closed before the process ends without Python's
    finalisation."""
    import traceback

    try:
        return main(argv)
    except Suspended as exc:  # told to stop (SIGTERM), checkpoint written
        print(f"graphrun trainer: {exc}", file=sys.stderr, flush=True)
        return SUSPENDED_EXIT
    except UserError as exc:  # its input is wrong
        print(f"graphrun trainer: error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    except GraphrunError as exc:
        print(f"graphrun trainer: error: {exc}", file=sys.stderr, flush=True)
        traceback.print_exc()
        return 1
    except Exception:  # a bug, or the user's entry point raised
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    import gc

    from graphrun.machine.process import exit_now
    from graphrun.machine.templates import drop_pyg_templates

    code = run_main()
    drop_pyg_templates()
    if code != 0:
        gc.collect()  # what the failure's frames held in cycles, finalised
    # done: every file is closed, the loaders' workers are gone. Python's finalisation
    # (1.5-2.5 s with torch and PyG loaded) ended failed trainers too, before their
    # machine could see them fail
    exit_now(code)
