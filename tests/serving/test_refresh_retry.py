"""A refresh that fails partway (issue 43, item 4): partition 0 took its writes (states
and running sums) and partition 1 refused its own, so the version was not written. A
retry, and the refresher that stays up, finish it: the states equal a full pass at the
version within 1e-5, also when the graph moved again before the retry. Before the
stamps, a retry moved partition 0's sums a second time."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from graphrun.errors import GraphrunError
from graphrun.serving.follow import ATTEMPTS
from graphrun.serving.refresh import States, full, refresh
from graphrun.serving.sums import LASTSUM
from graphrun.store.sum_moves import OP
from graphrun.train.models import GAT, SAGE

from .test_refresh import EDGES, NODES, assert_full_pass, following, graph_served, more, write

pytestmark = pytest.mark.integration


def refuse_partition_1(
    client: Any, monkeypatch: pytest.MonkeyPatch, op: str = "push_tables"
) -> list[int]:
    """A fault hook: while the list it returns holds a count above 0, each ``op``
    (``push_tables``, or ``move_sums``: the sums moved on their servers) to partition 1
    names a table its server does not have, so the server refuses the whole request (it
    checks every table before writing any) and the client raises once partition 0's
    answer is in. Each refusal counts one down."""
    left = [0]
    real = client.session.request

    def request(part: int, what: str, body: Any = None, *args: Any, **kw: Any) -> Any:
        if what == op and part == 1 and left[0] > 0:
            left[0] -= 1
            if op == OP:
                body = {**body, "sums": "serving/_N/not a table"}
            else:
                body = {**body, "names": ["serving/_N/not a table", *body["names"][1:]]}
        return real(part, what, body, *args, **kw)

    monkeypatch.setattr(client.session, "request", request)
    return left


@pytest.mark.parametrize("op", ["push_tables", OP])
@pytest.mark.parametrize("moved", [False, True], ids=["same head", "graph moved"])
def test_a_refresh_that_failed_partway_is_retried(tmp_path, monkeypatch, moved, op):
    """The retry finishes the refresh to version 1 (moving only the sums partition 0
    did not take yet); with ``moved`` the graph took another write before the retry,
    which then refreshes to 1 and from there to 2. The write refused is the states'
    (``push_tables``) or the last layer's sums moved on partition 1's server."""
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5, "csr", "fp32").eval()
    graph = {"num_nodes": NODES, "num_edges": EDGES}
    with graph_served(tmp_path / "parts", **graph) as (addresses, parts, ctx, data):
        full(model, data, "_N", "feat", 1024)
        write(addresses, parts)
        fault = refuse_partition_1(ctx.client, monkeypatch, op)
        fault[0] = 1
        with pytest.raises(GraphrunError, match="not a table"):
            refresh(model, data, "_N", "feat", 1024)
        assert States(ctx.client, "_N").load() == 0  # partition 0 moved, the version did not
        if moved:
            more(addresses, parts)
            with pytest.raises(GraphrunError, match="interrupted refresh"):
                refresh(model, data, "_N", "feat", 1024, version=0)
        got = refresh(model, data, "_N", "feat", 1024)
        assert (got["since"], got["version"]) == ((1, 2) if moved else (0, 1))
        assert got["updated"] > 0
        assert_full_pass(ctx, data, model, 2 if moved else 1)


def test_a_model_without_sums_is_retried_too(tmp_path, monkeypatch):
    """GAT keeps no sums: a retry computes again what the interrupted refresh wrote."""
    torch.manual_seed(0)
    model = GAT(8, 16, 4, 2, 0.5, heads=2).eval()
    graph = {"num_nodes": NODES, "num_edges": EDGES}
    with graph_served(tmp_path / "parts", **graph) as (addresses, parts, ctx, data):
        full(model, data, "_N", "feat", 1024)
        write(addresses, parts)
        refuse_partition_1(ctx.client, monkeypatch)[0] = 1
        with pytest.raises(GraphrunError, match="not a table"):
            refresh(model, data, "_N", "feat", 1024)
        more(addresses, parts)
        got = refresh(model, data, "_N", "feat", 1024)
        assert (got["since"], got["version"]) == (1, 2)
        assert_full_pass(ctx, data, model, 2)


def test_the_refresher_that_stays_up_retries_then_says_why_it_stopped(tmp_path, monkeypatch):
    """`--follow` after a refresh that failed partway: it tries again (each attempt
    failing the same way) until one goes through; when every attempt fails it stops
    after ``ATTEMPTS`` with the last error, and a refresh then finishes the one it gave
    up: the states equal a full pass."""
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5, "csr", "fp32").eval()
    graph = {"num_nodes": NODES, "num_edges": EDGES}
    with graph_served(tmp_path / "parts", **graph) as (addresses, parts, ctx, data):
        fault = refuse_partition_1(ctx.client, monkeypatch)
        with following(model, data) as got:
            assert got.get(timeout=120)["recomputed"] == NODES
            fault[0] = ATTEMPTS - 1
            write(addresses, parts)
            first = got.get(timeout=120)
            assert (first["since"], first["version"]) == (0, 1) and fault[0] == 0
            fault[0] = 10 * ATTEMPTS
            more(addresses, parts)
            err = got.get(timeout=120)
            assert isinstance(err, GraphrunError), err
            assert f"{ATTEMPTS} refreshes in a row failed" in str(err)
            assert "not a table" in str(err) and fault[0] == 9 * ATTEMPTS
        fault[0] = 0  # the store answers again: a refresh finishes the one it gave up
        again = refresh(model, data, "_N", "feat", 1024)
        assert (again["since"], again["version"]) == (1, 2)
        assert_full_pass(ctx, data, model, 2)


def test_sums_of_another_layout_are_refused(tmp_path):
    """Sums whose rows are not this model's (kept by another model, or before the rows
    had their stamps): the refresh says to run `--live` again, not a shape error."""
    torch.manual_seed(0)
    with graph_served(tmp_path / "parts") as (_, _, _, data):
        full(SAGE(8, 16, 4, 2, 0.5, "csr", "fp32").eval(), data, "_N", "feat", 64)
        other = SAGE(8, 16, 3, 2, 0.5, "csr", "fp32").eval()
        with pytest.raises(
            GraphrunError,
            match=r"lastsum has rows of \(6,\), this model "
            r"keeps \(5,\) \(run `graphrun infer embed",
        ):
            refresh(other, data, "_N", "feat", 64)


def test_a_kept_pass_replaces_sums_of_another_layout(tmp_path):
    """Sums kept by an earlier layout (``lastsum`` rows ``4C + 2`` wide before this
    one): the refresh refuses them and says to run the kept pass, which replaces them
    (it failed: their table existed with another shape), and a refresh goes on."""
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5, "csr", "fp32").eval()
    with graph_served(tmp_path / "parts") as (_, _, ctx, data):
        full(model, data, "_N", "feat", 64)
        st = States(ctx.client, "_N")
        ctx.client.delete_tensor(st.name(LASTSUM))
        st.tensor(LASTSUM, 18, "float64")
        with pytest.raises(GraphrunError, match=r"lastsum has rows of \(18,\).*--live"):
            refresh(model, data, "_N", "feat", 64)
        full(model, data, "_N", "feat", 64)
        assert States(ctx.client, "_N").tensor(LASTSUM).info.row_shape == (6,)
        assert refresh(model, data, "_N", "feat", 64)["updated"] == 0


def test_a_refresh_that_failed_before_its_first_write_is_retried(tmp_path, monkeypatch):
    """A refresh that took the new nodes into its ``States`` and failed before any write
    (the store refused the version it moves to): the next refresh with the same
    ``States`` (as ``--follow`` keeps it) starts from the stored new nodes, not from the
    failed one's. It kept them and read their rows from ``grown/`` tables no write had
    made yet: StoreError on every retry."""
    torch.manual_seed(0)
    model = SAGE(8, 16, 4, 2, 0.5, "csr", "fp32").eval()
    graph = {"num_nodes": NODES, "num_edges": EDGES}
    with graph_served(tmp_path / "parts", **graph) as (addresses, parts, ctx, data):
        full(model, data, "_N", "feat", 1024)
        write(addresses, parts)  # five new nodes
        st = States(ctx.client, "_N")
        real = States.begin

        def refused(self: States, version: int) -> None:
            raise GraphrunError("the store refused the version")

        monkeypatch.setattr(States, "begin", refused)
        with pytest.raises(GraphrunError, match="refused the version"):
            refresh(model, data, "_N", "feat", 1024, states=st)
        monkeypatch.setattr(States, "begin", real)
        got = refresh(model, data, "_N", "feat", 1024, states=st)
        assert (got["since"], got["version"]) == (0, 1)
        assert_full_pass(ctx, data, model, 1)
