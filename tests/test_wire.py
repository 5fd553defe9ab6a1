"""graphrun.wire's one header check and one file reader."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from graphrun.errors import DatasetError, SpecError
from graphrun.names import Endpoint, RoleName
from graphrun.wire import (
    Header,
    KeyFile,
    check_header,
    convert,
    convert_json,
    key_file_text,
    read_file,
    to_builtins,
)


class Thing(Header, kw_only=True):
    count: int


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "t.json: expected a JSON object"),
        ({"version": 1}, "t.json: field 'format' is None, not 'thing'"),
        ({"format": "other", "version": 1}, "t.json: field 'format' is 'other', not 'thing'"),
        ({"format": "thing"}, "t.json: field 'version' is None; this graphrun reads version 1"),
        ({"format": "thing", "version": 2}, "field 'version' is 2; this graphrun reads version 1"),
        (
            {"format": "thing", "version": True},
            "field 'version' is True; this graphrun reads version 1",
        ),
    ],
)
def test_a_header_not_ours_is_one_line_naming_file_and_field(data, message) -> None:
    with pytest.raises(SpecError) as info:
        check_header(data, "t.json", "thing", 1)
    assert str(info.value).startswith("t.json: ") and str(info.value).endswith(message)
    assert "\n" not in str(info.value)


def test_a_file_without_a_format_field_is_checked_by_its_version() -> None:
    check_header({"version": 1, "servers": []}, "store.json", None, 1, DatasetError)
    with pytest.raises(DatasetError, match=r"store\.json: field 'version' is 2"):
        check_header({"version": 2}, "store.json", None, 1, DatasetError)


def test_read_file_checks_the_header_before_the_fields(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "thing", "version": 1, "count": 3}))
    assert read_file(Thing, path, "a thing", "thing", 1).count == 3
    path.write_text(json.dumps({"format": "thing", "version": 2, "count": "x"}))
    with pytest.raises(SpecError, match="field 'version' is 2"):
        read_file(Thing, path, "a thing", "thing", 1)
    path.write_text(json.dumps({"format": "thing", "version": 1, "count": "x"}))
    with pytest.raises(SpecError, match=r"t\.json: count: Expected `int`, got `str`"):
        read_file(Thing, path, "a thing", "thing", 1)
    with pytest.raises(DatasetError, match=r"none\.json: missing \(a thing\)"):
        read_file(Thing, tmp_path / "none.json", "a thing", "thing", 1, DatasetError)


def test_the_key_file_has_one_layout_for_every_writer() -> None:
    pub, sec = "p" * 40, "s" * 40
    assert (
        key_file_text(pub, sec)
        == json.dumps({"format": "graphrun-key", "version": 1, "public": pub, "secret": sec}) + "\n"
    )
    assert json.loads(key_file_text(pub)) == {"format": "graphrun-key", "version": 1, "public": pub}
    back = msgspec.convert(json.loads(key_file_text(pub, sec, "v" * 40)), KeyFile)
    assert (back.public, back.secret, back.server) == (pub, sec, "v" * 40)


class _Listens(msgspec.Struct):
    endpoints: dict[RoleName, Endpoint]
    ready: Endpoint | None = None


def test_roles_and_endpoints_are_text_in_a_file_and_typed_once_read() -> None:
    value = _Listens({RoleName.store(0, replica=1): Endpoint("10.0.0.1", 30000)})
    data = to_builtins(value)
    assert data == {"endpoints": {"store:0:r": "10.0.0.1:30000"}, "ready": None}
    assert convert_json(_Listens, data, "f.json") == value
    # a key is no role: the line names the file and the field (a dec_hook's own
    # ValidationError lost where it was)
    with pytest.raises(SpecError, match=r"^f\.json: endpoints: 'stor:0' is not a role name"):
        convert_json(_Listens, {"endpoints": {"stor:0": "a:1"}}, "f.json")
    with pytest.raises(SpecError, match=r"^f\.json: ready: 'a' is not host:port"):
        convert(_Listens, {"endpoints": {}, "ready": "a"}, "f.json")
