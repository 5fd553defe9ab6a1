import json
import stat

import pytest

from graphrun.errors import ArgumentError
from graphrun.rpc.auth import KeyPair, generate_keys, load_keys


def test_generate_and_load(tmp_path):
    path = tmp_path / "job.key"
    keys = generate_keys(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_keys(path) == keys
    assert keys.secret not in repr(keys)
    assert generate_keys(tmp_path / "other.key") != keys  # never the same pair twice


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "cannot read key file"),
        (json.dumps({"format": "x"}), "'format'"),
        (json.dumps({"format": "graphrun-key", "version": 9}), "'version' is 9"),
        (json.dumps({"format": "graphrun-key", "version": 1, "public": "a"}), "KeyPair.public"),
    ],
)
def test_bad_key_files(tmp_path, content, match):
    path = tmp_path / "bad.key"
    path.write_text(content)
    with pytest.raises(ArgumentError, match=match):
        load_keys(path)


def test_missing_key_file(tmp_path):
    with pytest.raises(ArgumentError, match="cannot read"):
        load_keys(tmp_path / "none.key")
    with pytest.raises(ArgumentError):
        KeyPair("x" * 40, "short")
