"""Who may use a store: one admin key, and per-job keys that act only as their job.

A store server is started with its **admin** key pair (``--key-file``): its holders
(the store's own backups, the operator of the store, a job that owns its store) may do
everything. A long-running store shared by several jobs also admits **job keys**: the
key files in its ``--clients`` directory, one per job, named ``<job>.key`` (only the
public key is read). A job key holder

* may join, read the graph, and create, read, write and delete tensors of its own job
  only (requests naming another job are refused; requests naming none act as its job);
* may not ``stop`` the store, register backups, or read the store's ``manifest``.

The directory is read again when an unknown key knocks (at most once a second), so jobs
are admitted and revoked without a restart: add or remove ``<job>.key``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from graphrun.errors import AuthError

ADMIN_OPS = frozenset({"stop", "register_backup", "manifest"})
RESCAN_S = 1.0


class ClientKeys:
    """The job keys of a ``--clients`` directory: public key (Z85) -> job name."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._jobs: dict[str, str] = {}
        self._scanned = 0.0
        self._lock = threading.Lock()
        self._scan()

    def _scan(self) -> None:
        jobs = {}
        for path in sorted(self.directory.glob("*.key")):
            try:
                public = json.loads(path.read_text()).get("public")
            except (OSError, ValueError, AttributeError):
                continue  # not a key file: never admits anyone
            if isinstance(public, str) and len(public) == 40:
                jobs[public] = path.stem
        self._jobs, self._scanned = jobs, time.monotonic()

    def job_of(self, public: str) -> str | None:
        """The job a public key belongs to (None: not admitted); re-reads the directory
        for an unknown key, at most once a second."""
        with self._lock:
            job = self._jobs.get(public)
            if job is None and time.monotonic() - self._scanned > RESCAN_S:
                self._scan()
                job = self._jobs.get(public)
            return job

    def __contains__(self, public: object) -> bool:
        return isinstance(public, str) and self.job_of(public) is not None


class Access:
    """The rule above, for one server: ``admin`` is the admin public key (None: no CURVE,
    everyone is admin); ``clients`` the job keys (None: the admin key only)."""

    def __init__(self, admin: str | None, clients: ClientKeys | None = None) -> None:
        self.admin = admin
        self.clients = clients

    def check(self, user: str | None, op: str, job: str) -> tuple[str, bool]:
        """``(the job the request acts as, whether it is the admin)`` for a request of
        ``op`` naming ``job`` from the client with public key ``user``; AuthError if not
        allowed."""
        if self.admin is None or user == self.admin:
            return job, True
        owner = self.clients.job_of(user) if (self.clients and user) else None
        if owner is None:
            raise AuthError("this key is not admitted to the store")
        if op in ADMIN_OPS:
            raise AuthError(f"{op}: needs the store's admin key (this key is job {owner!r}'s)")
        if job and job != owner:
            raise AuthError(f"{op}: this key acts as job {owner!r}, not {job!r}")
        return owner, False
