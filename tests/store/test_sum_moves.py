"""``move_sums`` (issue 43): a partition's running sums moved where they are. The rows it
writes equal a plain numpy move (``np.add.at``, in the same order), a retry moves only
rows not stamped yet (and a new node's, summed from zero again: the same row), every bad
or oversized request is one error that changes nothing, and only a key that may write
the tables may call it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from graphrun.errors import ArgumentError, AuthError, GraphrunError, StoreError
from graphrun.rpc.auth import KeyPair, generate_keys, new_keypair, public_key_file_text
from graphrun.store import sum_moves
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.procs import child_env
from graphrun.testing.store import make_partition_dir, store_threads

C = 5  # classes
NAMES = {"sums": "s", "logits": "l", "predictions": "p", "lastown": "o"}


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    return make_partition_dir(tmp_path_factory.mktemp("moves") / "parts", 2)[1]


@dataclass
class Store:
    addresses: list[str]
    admin: KeyPair
    clients: Path

    def client(self, job: str, admin: bool = False) -> KVClient:
        keys = self.admin
        if not admin:
            pair = new_keypair()
            keys = KeyPair(pair.public, pair.secret, server=self.admin.public)
            (self.clients / f"{job}.key").write_text(public_key_file_text(keys.public, ()))
        return KVClient(ClientConfig(self.addresses, job=job, keys=keys, timeout=20))


@pytest.fixture
def store(parts, tmp_path) -> Iterator[Store]:
    admin = generate_keys(tmp_path / "store.key")
    clients = tmp_path / "clients"
    clients.mkdir()
    with store_threads(ServerConfig(parts, 0, keys=admin, clients_dir=clients), 2) as threads:
        yield Store([t.address for t in threads], admin, clients)


@dataclass
class Moves:
    """One request's tensors (:data:`sum_moves.TENSORS`), as numpy arrays."""

    rows: np.ndarray
    fresh: np.ndarray
    src: np.ndarray
    ch_at: np.ndarray
    ch_src: np.ndarray
    ch_sign: np.ndarray
    out_at: np.ndarray
    out_src: np.ndarray
    own_at: np.ndarray
    own: np.ndarray
    own_src: np.ndarray

    def tensors(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, t) for t in sum_moves.TENSORS)


def random_moves(rng: np.random.Generator, n: int, m: int = 40, k: int = 12) -> Moves:
    rows = np.sort(rng.choice(n, m, replace=False)).astype(np.int64)
    src = rng.standard_normal((k, 2 * C)).astype(np.float32)
    e, o, j = 30, 50, 6
    return Moves(
        rows, np.array([1], np.int32), src,
        rng.integers(0, m, e).astype(np.int32), rng.integers(0, k, e).astype(np.int32),
        rng.choice(np.array([-1, 1], np.int8), e),
        rng.integers(0, m, o).astype(np.int32), rng.integers(0, k, o).astype(np.int32),
        rng.choice(m, j, replace=False).astype(np.int32),
        rng.standard_normal((j, 2 * C)).astype(np.float32),
        rng.choice(k, j, replace=False).astype(np.int32),
    )  # fmt: skip


def expected(before: np.ndarray, mv: Moves, version: int) -> tuple[np.ndarray, ...]:
    """The rows, logits, predictions and own rows (of ``own_at``) a move leaves, by
    numpy: ``np.add.at`` (in order) over the rows not stamped ``version``."""
    got = before[mv.rows].copy()
    got[mv.fresh] = 0
    todo = got[:, -1] != version
    src = mv.src.astype(np.float64)
    own = mv.own.astype(np.float64)
    was = np.maximum(got[mv.own_at, C : C + 1], 1) * own[:, :C]
    keep = got[~todo].copy()
    sign = mv.ch_sign.astype(np.float64)
    np.add.at(got, (mv.ch_at, slice(0, C)), sign[:, None] * src[mv.ch_src, :C])
    np.add.at(got, (mv.ch_at, C), sign)
    np.add.at(got, (mv.out_at, slice(0, C)), src[mv.out_src, C:] - src[mv.out_src, :C])
    now = np.maximum(got[mv.own_at, C : C + 1], 1) * own[:, C:]
    np.add.at(got, (mv.own_at, slice(0, C)), now - was)
    got[~todo] = keep
    got[:, -1] = version
    logits = (got[:, :C] / np.maximum(got[:, C : C + 1], 1)).astype(np.float32)
    p = src[mv.own_src]
    mine = np.concatenate([p[:, C:], own[:, C:], p[:, :C], own[:, :C],
                           np.full((len(own), 1), version)], axis=1)  # fmt: skip
    return got, logits, logits.argmax(1), mine


def tables(c: KVClient, rng: np.random.Generator) -> np.ndarray:
    """The job's three tables, the sums random (in-degrees 0..4, stamps 0); the sums."""
    n = c.meta("node/_N/feat").num_rows
    c.init_tensor("s", "node:_N", (C + 2,), "float64")
    c.init_tensor("l", "node:_N", (C,), "float32")
    c.init_tensor("p", "node:_N", (), "int64")
    c.init_tensor("o", "node:_N", (4 * C + 1,), "float64")
    sums = np.concatenate([rng.standard_normal((n, C)), rng.integers(0, 5, (n, 1)),
                           np.zeros((n, 1))], axis=1)  # fmt: skip
    c.push("s", np.arange(n), sums)
    return sums


def call(c: KVClient, part: int, mv: Moves, version: int = 3, **body) -> dict:
    return dict(c.session.call(part, sum_moves.OP, {**NAMES, "version": version, **body},
                               tensors=mv.tensors()).body)  # fmt: skip


def partition_rows(c: KVClient, part: int) -> int:
    return c.policy("s").part_rows(part)


def read(c: KVClient, part: int, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    ids = rows + int(c.policy("s").ranges[part])
    return c.pull("s", ids), c.pull("l", ids), c.pull("p", ids), c.pull("o", ids)


def test_the_rows_move_as_numpy_moves_them_and_a_retry_moves_none(store):
    rng = np.random.default_rng(0)
    with store.client("emb") as c:
        sums = tables(c, rng)
        for part in (0, 1):
            n = partition_rows(c, part)
            mv = random_moves(rng, n)
            start = int(c.policy("s").ranges[part])
            local = sums[start : start + n]
            local[mv.rows[7], -1] = 3  # moved by an interrupted try already: kept
            c.push("s", [start + int(mv.rows[7])], local[mv.rows[7]][None])
            assert call(c, part, mv)["moved"] == len(mv.rows) - 1
            want = expected(local, mv, 3)
            got = read(c, part, mv.rows)
            np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-12)
            np.testing.assert_array_equal(got[1], want[1])
            np.testing.assert_array_equal(got[2], want[2])
            np.testing.assert_array_equal(got[3][mv.own_at], want[3])
            assert call(c, part, mv)["moved"] == 1  # the retry: the new node's row alone
            again = read(c, part, mv.rows)
            for a, b in zip(again, got, strict=True):
                np.testing.assert_array_equal(a, b)


def _bad(mv: Moves, n: int) -> dict[str, tuple[Moves, dict, str]]:
    i32, m = np.int32, len(mv.rows)
    past, last = np.append(mv.rows[:-1], n), np.append(mv.ch_at[:-1], i32(m))
    return {
        "row out of range": (replace(mv, rows=past), {}, "rows must increase inside"),
        "rows not increasing": (replace(mv, rows=mv.rows[::-1].copy()), {}, "must increase"),
        "rows of int32": (replace(mv, rows=mv.rows.astype(i32)), {}, "rows must be 1-d int64"),
        "more rows than it has": (replace(mv, rows=np.arange(n + 1)), {}, f"at most {n} rows"),
        "position out of range": (replace(mv, ch_at=last), {}, "ch_at holds a position"),
        "negative source": (
            replace(mv, out_src=np.append(mv.out_src[:-1], i32(-1))),
            {},
            "out_src holds a position outside",
        ),
        "edge lists differ": (replace(mv, ch_sign=mv.ch_sign[:-1]), {}, "differ in length"),
        "a sign of 2": (replace(mv, ch_sign=np.full_like(mv.ch_sign, 2)), {}, "other than -1"),
        "src too narrow": (replace(mv, src=mv.src[:, :-1].copy()), {}, "src rows have"),
        "own of another shape": (replace(mv, own=mv.own[:-1]), {}, "own has shape"),
        "own_src out of range": (
            replace(mv, own_src=np.append(mv.own_src[:-1], i32(len(mv.src)))),
            {},
            "own_src holds a position outside",
        ),
        "own_src short": (replace(mv, own_src=mv.own_src[:-1]), {}, "differ in length"),
        "lastown too narrow": (mv, {"lastown": "l"}, "'l' has float32 rows"),
        "logits of float64": (mv, {"logits": "s"}, "'s' has float64 rows"),
        "no such table": (mv, {"sums": "nope"}, "tensor 'nope' does not exist"),
        "a negative version": (mv, {"version": -1}, "version: a version is >= 0"),
    }


def test_a_bad_request_is_one_error_and_changes_nothing(store):
    rng = np.random.default_rng(1)
    with store.client("emb") as c:
        tables(c, rng)
        n = partition_rows(c, 0)
        mv = random_moves(rng, n)
        before = read(c, 0, np.arange(n))
        for what, (bad, body, message) in _bad(mv, n).items():
            with pytest.raises((ArgumentError, StoreError), match=message):
                call(c, 0, bad, **body)
            for a, b in zip(read(c, 0, np.arange(n)), before, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=what)
        with pytest.raises(ArgumentError, match="10 tensors, expected 11"):
            c.session.call(0, sum_moves.OP, {**NAMES, "version": 3}, tensors=mv.tensors()[:-1])


def test_an_oversized_edge_list_is_refused(store, monkeypatch):
    """More edges than :data:`MAX_EDGES` (16M in a real request: lowered here)."""
    rng = np.random.default_rng(2)
    monkeypatch.setattr(sum_moves, "MAX_EDGES", 20)
    with store.client("emb") as c:
        tables(c, rng)
        with pytest.raises(ArgumentError, match="ch_at must be 1-d int32 of at most 20 rows"):
            call(c, 0, random_moves(rng, partition_rows(c, 0)))


def test_only_a_key_that_may_write_the_tables_may_move_them(store):
    """Another job's key acts as its own job (a session's job is its key's: the tables
    are not there); no job key writes the graph's tensors, nor the admin key here."""
    rng = np.random.default_rng(3)
    with store.client("emb") as c:
        tables(c, rng)
        mv = random_moves(rng, partition_rows(c, 0))
        with store.client("other") as o, pytest.raises(StoreError, match="job 'other'"):
            call(o, 0, mv)  # its session's job's tables: 'emb''s are not there
        with pytest.raises(AuthError, match="the graph's tensors are read-only to a job key"):
            call(c, 0, mv, sums="node/_N/feat")
    with store.client("emb", admin=True) as a, pytest.raises(GraphrunError, match="read-only"):
        call(a, 0, mv, sums="node/_N/feat")


WARM_UP = """
import sys
from pathlib import Path
from graphrun.rpc.auth import generate_keys
from graphrun.serving import moves
from graphrun.store.client import ClientConfig, KVClient
from graphrun.store.server import ServerConfig
from graphrun.testing.store import store_threads

parts, tmp = Path(sys.argv[1]), Path(sys.argv[2])
admin = generate_keys(tmp / "store.key")
(tmp / "clients").mkdir()
with store_threads(ServerConfig(parts, 0, keys=admin, clients_dir=tmp / "clients"), 2) as ts:
    with KVClient(ClientConfig([t.address for t in ts], job="emb", keys=admin, timeout=1)) as c:
        c.init_tensor("s", "node:_N", (7,), "float64")
        c.init_tensor("l", "node:_N", (5,), "float32")
        c.init_tensor("p", "node:_N", (), "int64")
        c.init_tensor("o", "node:_N", (21,), "float64")
        moves.warm(c, {"lastsum": "s", "logits": "l", "predictions": "p",
                       "lastown": "o"}.__getitem__)
print("warm")
"""


def test_the_warm_up_waits_for_servers_that_compile_the_loops(parts, tmp_path):
    """A fresh install (numba's cache empty): each server's first ``move_sums`` compiles
    the loops, seconds on a 2-core box; the refresher's warm-up waits for that instead of
    failing at the client's timeout for a request (1 s here, 5 s by default: a clean
    clone's serving bench failed so)."""
    env = {**child_env(), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    out = subprocess.run([sys.executable, "-c", WARM_UP, str(parts), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["warm"]
