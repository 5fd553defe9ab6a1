"""What one machine of a job runs: typed launch plans, written as JSON for the worker.

A :class:`MachineLaunch` lists the role processes of one machine (store servers,
parameter servers, sampler workers, trainers — each a
:class:`~graphrun.machine.process.RoleCommand`), the endpoint at which each listening role
is ready, and the endpoints of *every* store and parameter server of the job, which
must accept connections before this machine starts its samplers and trainers. The
worker (``graphrun worker``) runs one; the local backend runs one worker per machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from graphrun.errors import SpecError
from graphrun.files import write_atomic
from graphrun.graph.format import read_json
from graphrun.machine.process import RoleCommand

RoleKind = Literal["store", "ps", "sampler", "trainer"]
KINDS: tuple[RoleKind, ...] = ("store", "ps", "sampler", "trainer")


@dataclass(frozen=True)
class RoleLaunch:
    kind: RoleKind
    command: RoleCommand
    ready: str | None = None  # "host:port" that accepts connections once the role is up

    @property
    def role(self) -> str:
        return self.command.role


@dataclass(frozen=True)
class MachineLaunch:
    machine: str
    roles: tuple[RoleLaunch, ...]
    wait_for: tuple[str, ...] = ()  # endpoints that must be up before samplers/trainers start
    ready_timeout_s: float = 120.0
    key_file: str | None = None  # the job's key: store servers are probed with it
    stall_timeout_s: float = 30.0  # a role stopped (SIGSTOP) this long fails the machine
    # store roles whose partition has another copy (runtime.replicas): once the job
    # trains, the machine survives their exit (the clients fail over to the other copy)
    replicated: tuple[str, ...] = ()

    def of_kind(self, kind: RoleKind) -> list[RoleLaunch]:
        return [r for r in self.roles if r.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "wait_for": list(self.wait_for),
            "ready_timeout_s": self.ready_timeout_s,
            "key_file": self.key_file,
            "stall_timeout_s": self.stall_timeout_s,
            "replicated": list(self.replicated),
            "roles": [
                {
                    "kind": r.kind,
                    "role": r.command.role,
                    "argv": list(r.command.argv),
                    "env": dict(r.command.env),
                    "cwd": r.command.cwd,
                    "ready": r.ready,
                }
                for r in self.roles
            ],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "<launch>") -> MachineLaunch:
        try:
            machine = str(data["machine"])
            roles = []
            for r in data["roles"]:
                if r["kind"] not in KINDS:
                    raise SpecError(f"{source}: role {r.get('role')!r}: unknown kind {r['kind']!r}")
                cmd = RoleCommand(
                    str(r["role"]),
                    machine,
                    tuple(str(a) for a in r["argv"]),
                    {str(k): str(v) for k, v in (r.get("env") or {}).items()},
                    r.get("cwd"),
                )
                roles.append(RoleLaunch(r["kind"], cmd, r.get("ready")))
            return cls(
                machine,
                tuple(roles),
                tuple(str(e) for e in data.get("wait_for", ())),
                float(data.get("ready_timeout_s", 120.0)),
                data.get("key_file"),
                float(data.get("stall_timeout_s", 30.0)),
                tuple(str(r) for r in data.get("replicated", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(f"{source}: malformed machine launch plan ({exc!r})") from None

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        write_atomic(p, json.dumps(self.to_dict(), indent=2) + "\n")
        return p

    @classmethod
    def read(cls, path: str | Path) -> MachineLaunch:
        p = Path(path)
        return cls.from_dict(read_json(p, "the launch plan", SpecError), str(p))
