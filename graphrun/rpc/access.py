"""Who may use a store: one admin key, and per-job keys that act only as their job.

A store server is started with its **admin** key pair (``--key-file``): its holders
(the store's own backups, the operator of the store, a job that owns its store) may do
everything. A long-running store shared by several jobs also admits **job keys**: the
files in its ``--clients`` directory, one per job, named ``<job>.key``; only their public
key is read (``graphrun keygen JOB.key --store STORE.key --clients DIR`` writes the
public half there and keeps the secret in ``JOB.key``). A job key holder

* may join, read the graph, and create, read, write and delete tensors of its own job
  only (requests naming another job are refused; requests naming none act as its job);
  the graph's own tensors (namespace ``""``) are read-only to it;
* may not ``stop`` the store, register backups, or read the store's ``manifest``;
* may not write the graph itself (the live graph's write ops, :data:`WRITE_GRAPH_OPS`)
  unless its public key file grants it: ``"grants": ["write_graph"]`` (made with
  ``graphrun keygen WRITER.key --store STORE.key --clients DIR --grants write_graph``).
  A writer's key is a key of its own, not a job's: the admin key is not needed to
  ingest, and a training job's key cannot change the graph it trains on.

The directory is checked again (file names, sizes and modification times: a ``stat`` per
file) when an unknown key knocks, and at most every :data:`RESCAN_S` seconds when a known
one does and on the server's tick, so jobs are admitted and revoked without a restart:
add or remove ``<job>.key``. A removed key is refused from then on, on new connections
(in the handshake) and on open ones (:class:`AuthError` naming the revocation); the
server ends its sessions.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from graphrun.errors import AuthError

log = logging.getLogger("graphrun.rpc")

ADMIN_OPS = frozenset({"stop", "register_backup", "manifest"})
WRITE_GRAPH = "write_graph"
GRANTS = frozenset({WRITE_GRAPH})  # what a --clients key file may grant beyond a job's
WRITE_GRAPH_OPS = frozenset(
    {"live_begin", "live_prepare", "live_decide", "live_commit", "live_compact"}
)
RESCAN_S = 0.2


class ClientKeys:
    """The job keys of a ``--clients`` directory: public key (Z85) -> job name."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._jobs: dict[str, str] = {}
        self._grants: dict[str, frozenset[str]] = {}  # public key -> its grants
        self._revoked: dict[str, str] = {}  # public key -> job, of keys since removed
        self._unclaimed: set[str] = set()  # revoked, not yet taken by take_revoked()
        self._signature: object = None
        self._checked = 0.0
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.refresh(force=True)

    def _stat_all(self) -> object:
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except OSError:
            return None
        out = []
        for e in entries:
            if e.name.endswith(".key"):
                try:
                    st = e.stat()
                except OSError:
                    continue
                out.append((e.name, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def _scan(self) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
        jobs, grants = {}, {}
        for path in sorted(self.directory.glob("*.key")):
            try:
                data = json.loads(path.read_text())
                public = data.get("public")
                given = data.get("grants", [])
            except (OSError, ValueError, AttributeError):
                continue  # not a key file: never admits anyone
            if not isinstance(given, list) or not set(given) <= GRANTS:
                log.warning("%s: grants %r are not a list of %s; the key is not admitted",
                            path, given, sorted(GRANTS))  # fmt: skip
                continue
            if isinstance(public, str) and len(public) == 40:
                jobs[public] = path.stem
                grants[public] = frozenset(given)
                if "secret" in data and path.name not in self._warned:
                    self._warned.add(path.name)
                    log.warning(
                        "%s holds a secret key: the store needs only the public one "
                        "(graphrun keygen JOB.key --store STORE.key --clients %s)",
                        path, self.directory,
                    )  # fmt: skip
        return jobs, grants

    def refresh(self, force: bool = False) -> None:
        """Re-read the directory if a file changed (checked at most every ``RESCAN_S``)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < RESCAN_S:
                return
            self._checked = now
            signature = self._stat_all()
            if signature == self._signature:
                return
            self._signature = signature
            old = self._jobs
            self._jobs, self._grants = self._scan()
            gone = {k: j for k, j in old.items() if k not in self._jobs}
            self._revoked.update(gone)
            for k in self._jobs:
                self._revoked.pop(k, None)
            self._unclaimed = (self._unclaimed | set(gone)) - set(self._jobs)
            for j in gone.values():
                log.warning("job key of %r revoked (%s/%s.key removed or changed)",
                            j, self.directory, j)  # fmt: skip

    def take_revoked(self) -> set[str]:
        """The public keys revoked since the last call (after a :meth:`refresh`)."""
        self.refresh()
        with self._lock:
            out, self._unclaimed = self._unclaimed, set()
            return out

    def job_of(self, public: str) -> str | None:
        """The job a public key belongs to (None: not admitted, or revoked). The directory
        is checked at once for an unknown key (a ``stat`` per file: cheaper than the
        handshake that asks), else at most every ``RESCAN_S``."""
        self.refresh()
        if public not in self._jobs:
            self.refresh(force=True)
        return self._jobs.get(public)

    def grants_of(self, public: str) -> frozenset[str]:
        """What the admitted key ``public`` is granted beyond a job key (after job_of)."""
        return self._grants.get(public, frozenset())

    def revoked_job(self, public: str) -> str | None:
        """The job of a key that was admitted and has been removed since (None: not so)."""
        return self._revoked.get(public)

    def __contains__(self, public: object) -> bool:
        return isinstance(public, str) and self.job_of(public) is not None


class Access:
    """The rule above, for one server: ``admin`` is the admin public key (None: no CURVE,
    everyone is admin); ``clients`` the job keys (None: the admin key only)."""

    def __init__(self, admin: str | None, clients: ClientKeys | None = None) -> None:
        self.admin = admin
        self.clients = clients

    def take_revoked(self) -> set[str]:
        """The job keys revoked since the last call (see :meth:`ClientKeys.take_revoked`)."""
        return self.clients.take_revoked() if self.clients is not None else set()

    def check(self, user: str | None, op: str, job: str) -> tuple[str, bool]:
        """``(the job the request acts as, whether it is the admin)`` for a request of
        ``op`` naming ``job`` from the client with public key ``user``; AuthError if not
        allowed."""
        if self.admin is None or user == self.admin:
            return job, True
        clients = self.clients
        owner = clients.job_of(user) if (clients and user) else None
        if owner is None:
            revoked = clients.revoked_job(user) if (clients and user) else None
            if clients is not None and revoked is not None:
                raise AuthError(
                    f"{op}: the job key of {revoked!r} was revoked "
                    f"({clients.directory}/{revoked}.key was removed)"
                )
            raise AuthError("this key is not admitted to the store")
        if op in ADMIN_OPS:
            raise AuthError(f"{op}: needs the store's admin key (this key is job {owner!r}'s)")
        granted = clients.grants_of(user) if (clients and user) else frozenset()
        if op in WRITE_GRAPH_OPS and WRITE_GRAPH not in granted:
            raise AuthError(
                f"{op}: writing the graph needs a key granted {WRITE_GRAPH!r} "
                f"(graphrun keygen ... --grants {WRITE_GRAPH}); this key is job {owner!r}'s"
            )
        if job and job != owner:
            raise AuthError(f"{op}: this key acts as job {owner!r}, not {job!r}")
        return owner, False
