"""``graphrun keygen --grants write_graph``: a writer's key of a live store (issue 42)."""

from __future__ import annotations

import json

from graphrun.cli import main
from graphrun.rpc.auth import load_keys


def test_keygen_grants_write_graph(tmp_path, capsys):
    store_key = tmp_path / "store.key"
    assert main(["keygen", str(store_key)]) == 0
    argv = ["keygen", str(tmp_path / "w.key"), "--store", str(store_key),
            "--clients", str(tmp_path / "clients"), "--grants", "write_graph"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((tmp_path / "clients" / "w.key").read_text())["grants"] == ["write_graph"]
    assert load_keys(tmp_path / "w.key").server == load_keys(store_key).public
    capsys.readouterr()
    assert main([*argv[:2], "--store", str(store_key), "--clients", str(tmp_path / "c2"),
                 "--grants", "root"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--grants: 'root' is not one of ['write_graph']" in err[0]
    assert not (tmp_path / "c2").exists()
