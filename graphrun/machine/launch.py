"""What one machine of a job runs: typed launch plans, written as JSON for the worker.

A :class:`MachineLaunch` lists the role processes of one machine (store servers,
parameter servers, sampler workers, trainers — each a
:class:`~graphrun.machine.process.RoleCommand`), the endpoint at which each listening role
is ready, and the servers of *every* partition and parameter server of the job
(:class:`Servers`), which must be up before this machine starts its samplers and
trainers. The worker (``graphrun worker``) runs one; the local backend runs one worker
per machine, each from its file (``RUN/launch/<machine>.json``, written by the
launcher), the operator's pods each build their own (``graphrun worker --job``).

The file begins with ``"format": "graphrun-launch"`` and ``"version"``
(:func:`graphrun.wire.check_header`). Version 2 lists what a machine waits for per
partition; a file of version 1 (``wait_for`` a flat list of endpoints, before a replica
could stand in for its primary) had no header and is refused for its missing
``format``, in one line naming the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from graphrun.errors import SpecError
from graphrun.files import read_json
from graphrun.machine.process import RoleCommand
from graphrun.machine.trainer_env import trainer_openmp
from graphrun.names import Endpoint, RoleName
from graphrun.wire import check_header, convert, write_json

FORMAT = "graphrun-launch"
VERSION = 2

RoleKind = Literal["store", "ps", "sampler", "trainer"]
KINDS: tuple[RoleKind, ...] = ("store", "ps", "sampler", "trainer")


class RoleLaunch(msgspec.Struct, frozen=True):
    """One role of a machine: its command line (:class:`RoleCommand`, less the machine)
    and the ``host:port`` that accepts connections once it is up (listening roles).
    ``role`` is read once, with the file; the supervisor names the process by it."""

    kind: RoleKind
    role: RoleName
    argv: tuple[str, ...]
    env: dict[str, str] = {}  # added to the inherited environment
    cwd: str | None = None
    ready: Endpoint | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.role, RoleName) or self.role.kind != self.kind:
            raise ValueError(f"role {self.role!r}: not a {self.kind} role")
        if not self.argv:
            raise ValueError(f"role {self.role}: argv must not be empty")
        if self.ready is not None and not isinstance(self.ready, Endpoint):
            raise ValueError(f"role {self.role}: ready {self.ready!r} is not an Endpoint")

    @classmethod
    def of(
        cls,
        kind: RoleKind,
        role: RoleName,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        ready: Endpoint | None = None,
    ) -> RoleLaunch:
        return cls(kind, role, tuple(argv), dict(env or {}), None, ready)


class Servers(msgspec.Struct, frozen=True, kw_only=True):
    """The servers of one partition (or one parameter server) that a machine waits for
    before it starts its samplers and trainers: ``main``, its main server and then its
    backups, and ``replicas``, its copies on other machines (``runtime.replicas``).

    They are up (:meth:`up`) when every one of them answers, or, once the main server
    does not, when one of its replicas does. A replica answers only after its primary
    has registered it (``graphrun.store.server``), so it holds every write the primary
    took, and a client that finds the primary gone joins it
    (:mod:`graphrun.store.session`): a replica stands in for a dead primary. It does not
    stand in sooner: while the primary is up, clients must wait for its replicas to
    register, or the tensors they create would never reach the replicas, and for its
    backups, or they would never learn them."""

    of: str  # what they serve ("partition 1", "ps:0"), named when the wait times out
    main: tuple[Endpoint, ...]
    replicas: tuple[Endpoint, ...] = ()

    def __post_init__(self) -> None:
        if not self.main:
            raise ValueError(f"{self.of}: main must name its main server")

    def up(self, is_ready: Callable[[Endpoint], bool]) -> bool:
        """Whether they are up, asking ``is_ready`` about each server (a store server
        answers a probe: :mod:`graphrun.machine.readiness`)."""
        if is_ready(self.main[0]):
            return all(is_ready(e) for e in (*self.main[1:], *self.replicas))
        return any(is_ready(e) for e in self.replicas)


class MachineLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """What one machine runs; its JSON file has these fields, in this order (``format``
    and ``version`` are always written: :func:`graphrun.wire.to_builtins` writes every
    field)."""

    format: str = FORMAT
    version: int = VERSION
    machine: str
    wait_for: tuple[Servers, ...] = ()  # must be up before samplers/trainers start
    ready_timeout_s: float = 120.0
    key_file: str | None = None  # the job's key: store servers are probed with it
    stall_timeout_s: float = 30.0  # a role stopped (SIGSTOP) this long fails the machine
    # store roles whose partition has another copy (runtime.replicas): once the job
    # trains, the machine survives their exit (the clients fail over to the other copy)
    replicated: tuple[RoleName, ...] = ()
    # runtime.elastic: a SIGTERM without the job-wide stop mark is this machine leaving
    # alone (graphrun.machine.stopmark), not a stop of the whole job
    elastic: bool = False
    # the store servers' write-ahead log directories (--live-dir), made before they start
    live_dirs: tuple[str, ...] = ()
    roles: tuple[RoleLaunch, ...]

    def __post_init__(self) -> None:
        if not all(isinstance(r, RoleName) for r in self.replicated):
            raise ValueError(f"replicated: {self.replicated!r} are not all RoleNames")

    def of_kind(self, kind: RoleKind) -> list[RoleLaunch]:
        return [r for r in self.roles if r.kind == kind]

    def joining(self) -> MachineLaunch:
        """This machine re-joining a running elastic job (a replacement pod started with
        ``GRAPHRUN_ELASTIC_JOIN=1``, or ``graphrun worker --join``: a lost machine the
        local launcher starts again): its samplers and trainers only, the trainers with
        ``--join``, which ask to be admitted at the next epoch boundary. Its store servers
        are not started again: their partitions' replicas serve, and a new primary would
        miss every tensor written since it was lost (docs/elastic.md)."""
        roles = tuple(
            msgspec.structs.replace(r, argv=(*r.argv, "--join")) if r.kind == "trainer" else r
            for r in self.roles
            if r.kind in ("sampler", "trainer")
        )
        # the job runs: its stores serve, or their replicas do for the lost ones (this
        # machine's among them), which its clients fail over to
        return msgspec.structs.replace(self, roles=roles, wait_for=(), replicated=())

    def with_trainer_openmp(self, inherited: Mapping[str, str]) -> MachineLaunch:
        """This machine with its CPU trainers' OpenMP waiting
        (:data:`~graphrun.machine.trainer_env.TRAINER_OPENMP`) added to their environment,
        where neither theirs nor ``inherited`` (the worker's: a pod's, the launcher's)
        sets its own (:func:`~graphrun.machine.trainer_env.trainer_openmp`)."""

        def role(r: RoleLaunch) -> RoleLaunch:
            if r.kind != "trainer" or "--gpu" in r.argv:
                return r
            return msgspec.structs.replace(
                r, env={**trainer_openmp({**inherited, **r.env}), **r.env}
            )

        return msgspec.structs.replace(self, roles=tuple(role(r) for r in self.roles))

    def command(self, role: RoleLaunch) -> RoleCommand[RoleName]:
        """What the supervisor starts for ``role``."""
        return RoleCommand(role.role, self.machine, role.argv, role.env, role.cwd)

    def write(self, path: str | Path) -> Path:
        return write_json(path, self)

    @classmethod
    def read(cls, path: str | Path) -> MachineLaunch:
        data = read_json(Path(path), "the launch plan", SpecError)
        check_header(data, str(path), FORMAT, VERSION)
        return convert(cls, data, str(path))
