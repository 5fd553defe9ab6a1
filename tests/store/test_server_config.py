"""run_server rejects a bad ServerConfig before loading anything (in-process, fast)."""

import pytest

from graphrun.errors import ArgumentError
from graphrun.store.server import ServerConfig, run_server


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"shm_dir": "missing"}, "shm_dir: .*missing is not a directory"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout"),
        ({"heartbeat_timeout": -3.0}, "heartbeat_timeout"),
        ({"heartbeat_timeout": float("nan")}, "heartbeat_timeout"),
        ({"request_timeout": 0}, "request_timeout"),
    ],
)
def test_bad_config_is_an_argument_error(homo, tmp_path, change, match):
    _, parts = homo
    fields = {"shm_dir": tmp_path, **change}
    if fields["shm_dir"] == "missing":
        fields["shm_dir"] = tmp_path / "missing"
    with pytest.raises(ArgumentError, match=match):
        run_server(ServerConfig(parts, 0, **fields))
    assert list(tmp_path.iterdir()) == []  # no shared memory created
