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
