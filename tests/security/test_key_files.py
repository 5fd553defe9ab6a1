"""Key files and other secrets on disk (issue 26): the store's clients directory holds
public keys only, a secret key open to others is refused, checkpoints are private."""

from __future__ import annotations

import json
import os

import pytest

from graphrun.cli import main
from graphrun.errors import ArgumentError
from graphrun.rpc.access import ClientKeys
from graphrun.rpc.auth import generate_keys, load_keys


def test_keygen_puts_only_the_public_key_in_the_clients_dir(tmp_path, capsys):
    """`graphrun keygen clients/JOB.key --store STORE.key` left every job's secret key in
    the store's clients directory; the store needs the public ones only."""
    store = generate_keys(tmp_path / "store.key")
    clients = tmp_path / "clients"
    clients.mkdir()
    secret = tmp_path / "job-a.key"
    assert main(["keygen", str(secret), "--store", str(tmp_path / "store.key"),
                 "--clients", str(clients)]) == 0  # fmt: skip
    public = json.loads((clients / "job-a.key").read_text())
    keys = load_keys(secret)
    assert public == {"format": "graphrun-key", "version": 1, "public": keys.public}
    assert keys.server == store.public and os.stat(secret).st_mode & 0o777 == 0o600
    assert ClientKeys(clients).job_of(keys.public) == "job-a"
    with pytest.raises(ArgumentError, match="public key only"):
        load_keys(clients / "job-a.key")
    capsys.readouterr()
    assert main(["keygen", str(tmp_path / "x.key"), "--clients", str(clients)]) == 2
    assert "--clients: needs --store" in capsys.readouterr().err
    assert not (tmp_path / "x.key").exists()


def test_a_secret_key_open_to_others_is_refused(parts, tmp_path, capsys):
    """A 0644 secret key file was accepted silently."""
    path = tmp_path / "store.key"
    generate_keys(path)
    os.chmod(path, 0o644)
    with pytest.raises(ArgumentError, match=r"mode 0644\); run: chmod 600 .*store.key"):
        load_keys(path)
    serve = ["serve", str(parts), "--part", "0", "--shm-dir", str(tmp_path)]
    assert main([*serve, "--key-file", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chmod 600" in err[0]
    os.chmod(path, 0o400)
    assert load_keys(path).public


def test_checkpoints_are_written_0600(tmp_path):
    """Checkpoints (the model, embeddings, optimizer state) were written 0644."""
    torch = pytest.importorskip("torch")
    from graphrun.train.checkpoint import Checkpoint, save_checkpoint

    path = save_checkpoint(tmp_path / "ck", Checkpoint(0, {"w": torch.zeros(2)}, {}, {}, {}))
    assert os.stat(path).st_mode & 0o777 == 0o600
