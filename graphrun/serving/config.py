"""The endpoint's command line, checked before anything starts (``graphrun infer ...``).

Loopback (:func:`graphrun.arguments.is_loopback_host`) means an IP address in 127.0.0.0/8
or ::1, or the name ``localhost``; any other address (``0.0.0.0``, a pod's address, a host
name) is reachable from elsewhere and needs ``--token-file``.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

from graphrun.errors import ArgumentError
from graphrun.job.spec import GraphJob, load_job
from graphrun.names import store_address
from graphrun.rpc.auth import KeyPair, load_keys
from graphrun.serving.model import ModelSpec

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$")
MIN_TOKEN = 16


def read_token(path: Path) -> str:
    """The bearer token in ``path``: one line of at least 16 printable characters."""
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ArgumentError(f"--token-file: cannot read {path} ({exc})") from None
    if len(text) < MIN_TOKEN or not text.isprintable() or " " in text:
        raise ArgumentError(
            f"--token-file: {path} must hold one token of at least {MIN_TOKEN} printable "
            f"characters, no spaces (e.g. `openssl rand -hex 32 > {path}`)"
        )
    return text


def store_addresses(given: list[str] | None, job: GraphJob) -> list[str]:
    """``--store`` (one per partition, partition order) or the job's ``graph.store``."""
    if not given:
        ref = job.spec.graph.store
        if ref is None:
            raise ArgumentError(
                "--store: give the main server of every partition (tcp://host:port, partition "
                "order), or name a running store in the job's spec.graph.store"
            )
        return list(ref.addresses)
    try:
        return [store_address(a) for a in given]
    except ArgumentError as exc:
        raise ArgumentError(f"--store: {exc}") from None


def job_key(given: Path | None, job: GraphJob, job_file: Path) -> tuple[Path, KeyPair]:
    """The job key (``--key-file``, or the job's ``graph.store.keyFile``): refused when it is
    a store's admin key, which could write the graph."""
    path = given
    if path is None:
        ref = job.spec.graph.store
        if ref is None or ref.key_file is None:
            raise ArgumentError("--key-file: give the job key the endpoint joins the store with")
        path = job_file.resolve().parent / ref.key_file
    keys = load_keys(path)
    if keys.server is None:
        raise ArgumentError(
            f"--key-file: {path} is a store's admin key; the endpoint joins with a job key, "
            f"which cannot write the graph (graphrun keygen JOB.key --store STORE.key "
            f"--clients DIR)"
        )
    return path, keys


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now: a port in use fails before the store is joined."""
    if not 0 <= port < 65536:
        raise ArgumentError(f"--port: {port} is not in [0, 65536)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ArgumentError(f"--host: {host!r} does not resolve ({exc.strerror or exc})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: a response's head and body, written apart, must not
    # wait for the client's delayed ACK (40 ms a request on a kept-alive connection)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise ArgumentError(
            f"--host/--port: cannot listen on {host}:{port} ({exc.strerror})"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class Target:
    """What both commands serve from: the job, its model spec, checkpoint, store and key."""

    job: GraphJob
    spec: ModelSpec
    checkpoint: Path
    servers: list[str]
    key_file: Path
    keys: KeyPair

    @property
    def job_name(self) -> str:
        """The job the endpoint acts as on the store: the job's own (its key must be that
        job's: the store refuses a key acting as another job)."""
        return self.job.name


def target(job_file: Path, store: list[str] | None, key_file: Path | None,
           checkpoint: Path | None) -> Target:  # fmt: skip
    from graphrun.machine.roles import job_paths

    job = load_job(job_file)
    spec = ModelSpec.of(job)
    ckpt = checkpoint if checkpoint is not None else job_paths(job, job_file).checkpoints
    if not (ckpt / "checkpoint.pt").is_file():
        raise ArgumentError(f"--checkpoint: {ckpt} holds no checkpoint.pt (train the job first)")
    servers = store_addresses(store, job)
    path, keys = job_key(key_file, job, job_file)
    return Target(job, spec, ckpt, servers, path, keys)
