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
    sampling = ("graphrun.sampling.server:register",)  # to read the new edges back
    cfg = ServerConfig(parts, 0, keys=admin, clients_dir=clients, extensions=sampling)
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


def new_rows(addresses, key, n):
    """``n`` rows of every node feature of the store's type."""
    c = client(addresses, key)
    try:
        tensors = [t for t in c.list_tensors() if t.name.startswith("node/_N/")]
    finally:
        c.close()
    return {t.name.rsplit("/", 1)[1]: np.ones((n, *t.row_shape), t.dtype) for t in tensors}


def lookup(addresses, key, ids):
    """Graph ids of ``ids`` (-1: unknown) and the head (the last version committed)."""
    from graphrun.distributed.writer import GraphWriter
    from graphrun.store.live_client import fetch_head

    c = client(addresses, key)
    try:
        view = fetch_head(c.session)
        return GraphWriter(c).lookup(ids), view.head
    finally:
        c.close()


def in_sources(addresses, key, seeds):
    """The source of every in-edge of each seed (graph ids), at the head."""
    from tests.store.test_live_store import in_edges

    c = client(addresses, key)
    try:
        c.follow()
        return in_edges(c, seeds, "src")
    finally:
        c.close()


def test_a_pipelined_ingest_commits_every_chunk(live, tmp_path, capsys):
    """Node chunks then edge chunks naming them by original id, 8 in flight (the later
    ones' ends looked up ahead and sent as graph ids): every row is in the store, each
    edge between the nodes it names, each chunk at its own version, and progress counts
    them."""
    addresses, key, store = live
    n = 200
    ids = np.arange(50_000, 50_000 + n)
    ends = (np.r_[ids, ids], np.r_[np.roll(ids, 1), np.arange(n)])  # new-new, new-base
    write_npy(tmp_path / "new", ids, new_rows(addresses, key, n), ends)
    argv = ["ingest", str(tmp_path / "new"), *store, "--key-file", str(key)]
    assert main([*argv, "--chunk-rows", "20", "--window", "8", "--progress-s", "0"]) == 0
    out, err = capsys.readouterr()
    assert "600 rows (200 nodes, 400 edges) in 30 chunks, versions 1..30" in out
    assert len(err.splitlines()) == 30  # a line a chunk acknowledged
    assert err.splitlines()[9].startswith("ingest: 200 rows (200 nodes, 0 edges) in 10 chunks")
    got, head = lookup(addresses, key, ids)
    assert (got >= 600).all() and len(set(got.tolist())) == n and head == 30
    from graphrun.partition import load_id_mapping

    sources = in_sources(addresses, key, got)  # ids[i + 1] -> ids[i], nothing else
    assert all(sources[i] == {int(got[(i + 1) % n])} for i in range(n))
    base = np.argsort(load_id_mapping(tmp_path / "parts").orig_nids)[:n]  # graph ids of 0..n-1
    sources = in_sources(addresses, key, base)  # ids[i] -> the base node of original id i
    assert all(int(got[i]) in sources[i] for i in range(n))


def committed_in(line: str, name: str) -> set[int]:
    """The rows of ``name`` the one error line says were committed after the refused chunk."""
    import re

    after = line.split("after it (in flight then) ")[1:]
    spans = re.findall(rf"{name}: rows (\d+)\.\.(\d+)", after[0].split(";")[0]) if after else []
    return {r for lo, hi in spans for r in range(int(lo), int(hi) + 1)}


@pytest.mark.parametrize("window", ["8", "1"])
def test_a_refused_chunk_in_flight_is_named_with_what_was_committed(live, tmp_path, capsys, window):
    """Five node chunks in flight, the third refused by the sequencer (one id is a node
    of the graph already): one line names its rows, exit 2, and says which chunks are
    committed (those before it and those after it in flight then); the store has exactly
    those."""
    from graphrun.partition import load_id_mapping

    addresses, key, store = live
    ids = np.arange(60_000, 60_025)
    ids[12] = load_id_mapping(tmp_path / "parts").orig_nids[3]
    write_npy(tmp_path / "new", ids, new_rows(addresses, key, 25))
    argv = ["ingest", str(tmp_path / "new"), *store, "--key-file", str(key), "--chunk-rows", "5"]
    assert main([*argv, "--window", window]) == 2
    *_, err = capsys.readouterr().err.splitlines()
    assert err.startswith(f"graphrun: error: {tmp_path / 'new' / 'nodes' / 'id.npy'}: rows 10..14:")
    assert f"original id {ids[12]} is a node of the graph already" in err
    after = committed_in(err, "id.npy")
    assert after <= set(range(15, 25))  # in flight then: as many as had been sent
    assert ("nothing after them was sent" in err) == bool(after)
    committed = set(range(10)) | after
    assert f"committed: {len(committed)} rows ({len(committed)} nodes, 0 edges)" in err
    got, _ = lookup(addresses, key, ids)
    assert {i for i in range(25) if got[i] >= 600} == committed


def test_an_edge_chunk_with_an_unknown_end_stops_after_those_in_flight(live, tmp_path, capsys):
    """An edge chunk naming an original id the store does not know is refused before it
    is sent (looked up): the chunks in flight before it are answered and committed, the
    line names it and counts them; nothing after it is sent."""
    addresses, key, store = live
    src, dst = np.arange(40), np.arange(1, 41)
    src[23] = 99_999_999  # no such node
    write_npy(tmp_path / "new", np.arange(70_000, 70_001), new_rows(addresses, key, 1), (src, dst))
    argv = ["ingest", str(tmp_path / "new"), *store, "--key-file", str(key), "--chunk-rows", "5"]
    assert main([*argv, "--window", "8"]) == 2
    *_, err = capsys.readouterr().err.splitlines()
    assert f"{tmp_path / 'new' / 'edges'}: rows 20..24: " in err
    assert "committed: 21 rows (1 nodes, 20 edges) in 5 chunks, versions 1..5, " in err
    assert err.endswith(" rows/s: every chunk before it")
    _, head = lookup(addresses, key, [0])
    assert head == 5  # nothing of it or after it


def test_a_bad_file_row_stops_after_the_chunks_read_before_it_are_committed(live, tmp_path, capsys):
    """A chunk that fails its read (a mask of 2 in row 12) stops the command with the
    chunks before it committed: the one held for the lookup ahead too."""
    addresses, key, store = live
    ids = np.arange(80_000, 80_025)
    rows = new_rows(addresses, key, 25)
    rows["train_mask"] = np.ones(25, np.int64)
    rows["train_mask"][12] = 2
    write_npy(tmp_path / "new", ids, rows)
    argv = ["ingest", str(tmp_path / "new"), *store, "--key-file", str(key), "--chunk-rows", "5"]
    assert main([*argv, "--window", "8"]) == 2
    *_, err = capsys.readouterr().err.splitlines()
    assert "train_mask.npy: must be boolean or 0/1; before it: 10 rows (10 nodes, 0 edges)" in err
    got, head = lookup(addresses, key, ids)
    assert (got[:10] >= 600).all() and (got[10:] == -1).all() and head == 2
