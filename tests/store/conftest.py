import numpy as np
import pytest

from graphrun.partition import load_id_mapping, load_partition_book
from graphrun.rpc.auth import generate_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads


@pytest.fixture(scope="session")
def homo(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("homo") / "parts", 2)


@pytest.fixture(scope="session")
def hetero(tmp_path_factory):
    return make_partition_dir(tmp_path_factory.mktemp("hetero") / "parts", 2, hetero=True)


@pytest.fixture(scope="session")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "job.key"
    generate_keys(path)
    return path


@pytest.fixture(scope="session")
def keys(key_file):
    from graphrun.rpc.auth import load_keys

    return load_keys(key_file)


@pytest.fixture
def stores(homo, keys):
    _, parts = homo
    cfg = ServerConfig(parts, 0, keys=keys, heartbeat_timeout=30)
    with store_threads(cfg, 2) as s:
        yield s


def connect(stores, keys, **kw):
    return KVClient(ClientConfig([s.address for s in stores], keys=keys, **kw))


def reference_rows(graph, parts, kind, key, name, ids):
    """Rows of the original graph's feature for per-type NEW ids of the partition."""
    book = load_partition_book(parts)
    m = load_id_mapping(parts)
    if kind == "node":
        homo = book.to_homo(key, ids)
        orig = m.orig_nids[homo] - graph.node_type_offsets[graph.node_types.index(key)]
        return graph.ndata[key][name][orig]
    homo = book.etype_to_homo(key, ids)
    et = tuple(key.split(":"))
    orig = m.orig_eids[homo] - graph.edge_type_offsets[graph.edge_types.index(et)]
    return graph.edata[key][name][orig]


@pytest.fixture
def rng():
    return np.random.default_rng(0)
