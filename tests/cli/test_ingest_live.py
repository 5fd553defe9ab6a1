"""``graphrun ingest`` through ``GraphWriter`` into a live store on real servers: chunks
committed as versions, ends named by original ids, a refused chunk one line.

Needs the live store (``graphrun.distributed.writer``, issue 42's core); skipped where it
is not there yet."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("graphrun.distributed.writer")

from graphrun.cli import main
from graphrun.rpc.auth import generate_keys, load_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads

pytestmark = pytest.mark.integration


@pytest.fixture
def live(tmp_path):
    _, parts = make_partition_dir(tmp_path / "parts", 2)
    admin = generate_keys(tmp_path / "store.key")
    clients = tmp_path / "clients"
    key = tmp_path / "writer.key"
    grant = ["--clients", str(clients), "--grants", "write_graph"]
    assert main(["keygen", str(key), "--store", str(tmp_path / "store.key"), *grant]) == 0
    cfg = ServerConfig(parts, 0, keys=admin, clients_dir=clients)
    with store_threads(cfg, 2) as threads:
        addresses = [t.address for t in threads]
        yield addresses, key, [x for a in addresses for x in ("--store", a)]


def client(addresses, key):
    return KVClient(ClientConfig(addresses, job=key.stem, keys=load_keys(key), timeout=20))


def write_npy(root, ids, rows, ends=None):
    (root / "nodes").mkdir(parents=True)
    np.save(root / "nodes" / "id.npy", ids)
    for name, a in rows.items():
        np.save(root / "nodes" / f"{name}.npy", a)
    if ends is not None:
        (root / "edges").mkdir()
        np.save(root / "edges" / "src.npy", ends[0])
        np.save(root / "edges" / "dst.npy", ends[1])


def test_ingest_commits_each_chunk_and_maps_ids(live, tmp_path, capsys):
    addresses, key, store = live
    c = client(addresses, key)
    try:
        tensors = {t.name: t for t in c.list_tensors() if t.name.startswith("node/_N/")}
    finally:
        c.close()
    n = 25
    rows = {
        name.rsplit("/", 1)[1]: np.ones((n, *t.row_shape), dtype=t.dtype)
        for name, t in tensors.items()
    }
    new_ids = np.arange(10_000, 10_000 + n)
    write_npy(tmp_path / "new", new_ids, rows, (new_ids, np.arange(n)))
    argv = ["ingest", str(tmp_path / "new"), *store, "--key-file", str(key), "--chunk-rows", "10"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "50 rows (25 nodes, 25 edges) in 6 chunks, versions 1..6" in out
    from graphrun.distributed.writer import GraphWriter

    c = client(addresses, key)
    try:
        got = GraphWriter(c).lookup(np.r_[new_ids, 20_000])
    finally:
        c.close()
    assert (got[:n] >= 600).all() and len(set(got[:n].tolist())) == n  # new graph ids
    assert got[n] == -1

    rows["feat"] = np.ones((3, 3), dtype=rows["feat"].dtype)  # the wrong width
    write_npy(tmp_path / "bad", np.arange(20_000, 20_003), {k: v[:3] for k, v in rows.items()})
    assert main(["ingest", str(tmp_path / "bad"), *store, "--key-file", str(key)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "id.npy: rows 0..2: features['feat']: got float32 (3, 3)" in err
