"""``GraphWriter.submit(tag=...)`` and ``answered()``: a pipelined writer says which batch
was refused and which were acknowledged, at which versions (``graphrun ingest`` reports
from them which chunks are in the store). On real store servers."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from graphrun.distributed.writer import Answer, GraphWriter
from graphrun.errors import ArgumentError
from graphrun.partition import load_id_mapping
from graphrun.rpc.auth import KeyPair, generate_keys, new_keypair, public_key_file_text
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import make_partition_dir, store_threads

pytestmark = pytest.mark.integration


@pytest.fixture
def writer(tmp_path) -> Iterator[tuple[KVClient, np.ndarray]]:
    """A writer's client of a 2-partition live store, and the base nodes' original ids."""
    _, parts = make_partition_dir(tmp_path / "parts", 2)
    admin = generate_keys(tmp_path / "store.key")
    clients = tmp_path / "clients"
    clients.mkdir()
    pair = new_keypair()
    (clients / "writer.key").write_text(public_key_file_text(pair.public, ("write_graph",)))
    keys = KeyPair(pair.public, pair.secret, server=admin.public)
    cfg = ServerConfig(parts, 0, keys=admin, clients_dir=clients)
    with store_threads(cfg, 2) as threads:
        c = KVClient(ClientConfig([t.address for t in threads], job="writer", keys=keys,
                                  timeout=20))  # fmt: skip
        try:
            yield c, load_id_mapping(parts).orig_nids
        finally:
            c.close()


def node_rows(c: KVClient, n: int) -> dict[str, np.ndarray]:
    return {
        t.name.rsplit("/", 1)[1]: np.ones((n, *t.row_shape), t.dtype)
        for t in c.list_tensors()
        if t.name.startswith("node/_N/")
    }


def test_answers_name_the_refused_batch_and_those_acknowledged_after_it(writer):
    """Five batches in flight, the third refused by the sequencer (a base node's original
    id): ``flush`` raises it, and ``answered`` gives every batch's tag, in submission
    order: the refused one with its error, the others (after it too) with their versions,
    and the store has exactly those."""
    c, base = writer
    w = GraphWriter(c, window=8)
    ids = [np.arange(10**9 + 10 * k, 10**9 + 10 * k + 3) for k in range(5)]
    ids[2] = np.r_[ids[2][:2], base[7]]  # a node of the graph already
    for k in range(5):
        w.add_nodes("_N", ids[k], node_rows(c, 3))
        w.submit(tag=f"batch {k}")
    with pytest.raises(ArgumentError, match="is a node of the graph already") as refused:
        w.flush()
    got = w.answered()
    assert [a.tag for a in got] == [f"batch {k}" for k in range(5)]
    assert got[2] == Answer("batch 2", 0, refused.value)
    acked = [a for a in got if a.error is None]
    assert len(acked) == 4 and [a.version for a in acked] == sorted(a.version for a in acked)
    assert acked[-1].version == w._last and w.answered() == []  # taken
    found = w.lookup(np.concatenate(ids))
    assert (found.reshape(5, 3)[[0, 1, 3, 4]] >= c.book.num_nodes).all()
    assert (found[6:8] == -1).all()  # nothing of the refused batch


def test_a_writer_keeps_no_answers_of_untagged_batches(writer):
    """``commit()`` and ``submit()`` without a tag leave nothing for ``answered`` to keep:
    a writer that streams for days and never asks holds no answer per batch."""
    c, _ = writer
    w = GraphWriter(c, window=4)
    for k in range(3):
        w.add_nodes("_N", np.arange(10**9 + 10 * k, 10**9 + 10 * k + 2), node_rows(c, 2))
        w.submit()
    w.add_nodes("_N", np.arange(2 * 10**9, 2 * 10**9 + 2), node_rows(c, 2))
    w.commit()
    assert w.answered() == [] and len(w.flush()) == 0


def test_a_writer_that_never_flushes_keeps_the_latest_versions_only(writer, monkeypatch):
    """A pipelined stream that submits for days without a ``flush`` keeps at most
    ``MAX_ACKNOWLEDGED`` acknowledged versions (the latest), not one a batch for ever."""
    import graphrun.distributed.writer as writer_module

    monkeypatch.setattr(writer_module, "MAX_ACKNOWLEDGED", 3)
    c, _ = writer
    w = GraphWriter(c, window=2)
    for k in range(6):
        w.add_nodes("_N", np.arange(3 * 10**9 + 10 * k, 3 * 10**9 + 10 * k + 2), node_rows(c, 2))
        w.submit()
    versions = w.flush()
    assert len(versions) == 3 and versions == sorted(versions)
    assert versions[-1] == w._last  # the latest
