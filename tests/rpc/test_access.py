"""Who may do what on a store: the admin key everything, a job key only as its job."""

from __future__ import annotations

import pytest

from graphrun.errors import AuthError
from graphrun.rpc.access import Access, ClientKeys
from graphrun.rpc.auth import generate_keys


def test_job_keys_act_only_as_their_job(tmp_path) -> None:
    admin = generate_keys(tmp_path / "admin.key").public
    clients = tmp_path / "clients"
    clients.mkdir()
    a = generate_keys(clients / "jobA.key").public
    (clients / "junk.key").write_text("not json")
    access = Access(admin, ClientKeys(clients))
    assert access.check(admin, "stop", "") == ("", True)
    assert access.check(a, "join", "jobA") == ("jobA", False)
    assert access.check(a, "stats", "") == ("jobA", False)  # no job named: its own
    with pytest.raises(AuthError, match="acts as job 'jobA', not 'jobB'"):
        access.check(a, "pull", "jobB")
    for op in ("stop", "register_backup", "manifest"):
        with pytest.raises(AuthError, match="needs the store's admin key"):
            access.check(a, op, "jobA")
    b = generate_keys(tmp_path / "b.key").public
    with pytest.raises(AuthError, match="not admitted"):
        access.check(b, "join", "jobB")
    assert Access(None).check(None, "stop", "x") == ("x", True)  # no CURVE: no keys


def test_only_a_key_granted_write_graph_writes_the_graph(tmp_path) -> None:
    from graphrun.rpc.access import WRITE_GRAPH_OPS
    from graphrun.rpc.auth import new_keypair, public_key_file_text

    admin = generate_keys(tmp_path / "admin.key").public
    clients = tmp_path / "clients"
    clients.mkdir()
    job, writer, odd = (new_keypair().public for _ in range(3))
    (clients / "job-a.key").write_text(public_key_file_text(job))
    (clients / "ingest.key").write_text(public_key_file_text(writer, ["write_graph"]))
    (clients / "odd.key").write_text(public_key_file_text(odd, ["root"]))  # never admitted
    access = Access(admin, ClientKeys(clients))
    for op in sorted(WRITE_GRAPH_OPS):
        with pytest.raises(AuthError, match=f"{op}: writing the graph needs a key granted"):
            access.check(job, op, "")
        assert access.check(writer, op, "") == ("ingest", False)
        assert access.check(admin, op, "") == ("", True)
    assert access.check(job, "live_head", "") == ("job-a", False)  # reading the head: any key
    with pytest.raises(AuthError, match="not admitted"):
        access.check(odd, "join", "odd")
