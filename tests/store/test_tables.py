"""``pull_tables``: rows of several tensors in one request an owner (store/tables.py)."""

import numpy as np
import pytest

from graphrun.errors import ArgumentError, StoreError
from graphrun.store.tables import pull_tables
from tests.store.conftest import connect

FEAT = "node/_N/feat"


def _tables(c, rng):
    c.init_tensor("a", "node:_N", (3,), persistent=True, exist_ok=True)
    c.init_tensor("b", "node:_N", (), "int64", persistent=True, exist_ok=True)
    all_ids = np.arange(600)
    c.push_tables([("a", all_ids, rng.random((600, 3), dtype=np.float32)),
                   ("b", all_ids, rng.integers(0, 99, 600))])  # fmt: skip


def _served(c, op):
    return sum(c.stats(p)["served"].get(op, 0) for p in range(2))


@pytest.mark.parametrize("use_shm", [False, True])
def test_pull_tables_equals_a_pull_of_each(stores, keys, rng, use_shm):
    """Ids over both partitions (repeated, unordered), of one owner, and none: each table's
    rows as its own ``pull`` reads them; over the network one request an owner for all the
    tables, no ``pull``; in shared memory the pulls (no request)."""
    with connect(stores, keys, job="tb") as w:
        _tables(w, rng)
    with connect(stores, keys, job="tb", use_shm=use_shm) as c:
        for ids in (rng.integers(0, 600, 200), np.array([5, 1, 5]), np.arange(0)):
            before = {op: _served(c, op) for op in ("pull", "pull_tables")}
            got = pull_tables(c, ["a", "b", FEAT], ids)
            after = {op: _served(c, op) for op in ("pull", "pull_tables")}
            if not use_shm:
                assert after["pull"] == before["pull"]
                bounds = c.policy("a").ranges
                owners = len(np.unique(np.searchsorted(bounds, ids, "right"))) if len(ids) else 1
                assert after["pull_tables"] - before["pull_tables"] == owners
            else:
                assert after == before
            for name, rows in zip(["a", "b", FEAT], got, strict=True):
                want = c.pull(name, ids)
                assert rows.dtype == want.dtype and rows.shape == want.shape
                np.testing.assert_array_equal(rows, want)


def test_pull_tables_in_pieces(stores, keys, rng):
    """An owner's rows past ``pull_chunk_bytes`` of answer: several requests, in place."""
    with connect(stores, keys, job="tb") as w:
        _tables(w, rng)
    with connect(stores, keys, job="tb", use_shm=False, pull_chunk_bytes=64) as c:
        ids = rng.integers(0, 600, 300)
        before = _served(c, "pull_tables")
        got = pull_tables(c, ["a", "b"], ids)
        assert _served(c, "pull_tables") - before > 2
        np.testing.assert_array_equal(got[0], c.pull("a", ids))
        np.testing.assert_array_equal(got[1], c.pull("b", ids))


def test_pull_tables_refuses_what_it_cannot_read(stores, keys, rng):
    """Tensors of two policies, no tensors or too many: one clear error, at the client
    and (a request made by hand) at the server; rows out of range too."""
    with connect(stores, keys, job="tb", use_shm=False) as c:
        _tables(c, rng)
        edges = next(str(p) for p in c.policies if str(p).startswith("edge:"))
        c.init_tensor("e", edges, (), "int64", persistent=True, exist_ok=True)
        with pytest.raises(ArgumentError, match="one partition policy"):
            pull_tables(c, ["a", "e"], [1])
        with pytest.raises(ArgumentError, match="1 to 24 tensors"):
            pull_tables(c, [], [1])
        with pytest.raises(ArgumentError, match="1 to 24 tensors"):
            pull_tables(c, ["a"] * 25, [1])
        rows = np.array([0, 1], np.int64)
        with pytest.raises(ArgumentError, match="one partition policy"):
            c.session.call(0, "pull_tables", {"names": ["a", "e"]}, tensors=(rows,))
        with pytest.raises(ArgumentError, match="out of range"):
            c.session.call(0, "pull_tables", {"names": ["a", "b"]}, tensors=(rows + 10**6,))
        other = connect(stores, keys, job="other", use_shm=False)  # not its job's "a"
        with other as o, pytest.raises(StoreError, match="'a'"):
            o.session.call(0, "pull_tables", {"names": [FEAT, "a"]}, tensors=(rows,))
        got = c.session.call(0, "pull_tables", {"names": ["b", "a"]}, tensors=(rows,)).tensors
        np.testing.assert_array_equal(got[0], c.pull("b", [0, 1]))
        np.testing.assert_array_equal(got[1], c.pull("a", [0, 1]))
