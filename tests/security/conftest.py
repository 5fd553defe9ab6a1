"""A one-partition store with an admin key and a clients directory of job keys."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphrun.rpc.auth import KeyPair, generate_keys, new_keypair, public_key_file_text
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import StoreThread, make_partition_dir

FEAT = "node/_N/feat"


@dataclass
class SharedStore:
    address: str
    admin: KeyPair
    clients: Path
    shm: Path

    def job_key(self, job: str) -> KeyPair:
        """A job key of this store, its public half admitted in the clients directory."""
        pair = new_keypair()
        keys = KeyPair(pair.public, pair.secret, server=self.admin.public)
        (self.clients / f"{job}.key").write_text(public_key_file_text(keys.public))
        return keys

    def client(self, keys: KeyPair, job: str, **kw: object) -> KVClient:
        kw.setdefault("use_shm", False)
        kw.setdefault("timeout", 10)
        return KVClient(ClientConfig([self.address], job=job, keys=keys, **kw))


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    return make_partition_dir(tmp_path_factory.mktemp("sec") / "parts", 1)[1]


@pytest.fixture
def shared_store(parts, tmp_path) -> Iterator[SharedStore]:
    admin = generate_keys(tmp_path / "store.key")
    clients = tmp_path / "clients"
    clients.mkdir()
    shm = tmp_path / "shm"
    shm.mkdir()
    cfg = ServerConfig(parts, 0, keys=admin, clients_dir=clients, shm_dir=shm)
    with StoreThread(cfg) as s:
        yield SharedStore(s.address, admin, clients, shm)
