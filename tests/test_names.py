"""Role names: one type formats and parses them."""

import pytest

from graphrun.names import RoleName


@pytest.mark.parametrize(
    "text, name",
    [
        ("store:3", RoleName.store(3)),
        ("store:3:1", RoleName.store(3, 1)),
        ("trainer:0", RoleName.trainer(0)),
        ("sampler:2:1", RoleName.sampler(2, 1)),
        ("ps:4", RoleName.ps(4)),
    ],
)
def test_role_names_round_trip(text, name):
    assert str(name) == text and RoleName.parse(text) == name


def test_the_main_store_server_has_no_backup_suffix():
    assert str(RoleName.store(1, 0)) == "store:1"
    assert RoleName.parse("store:1:0") == RoleName.parse("store:1")


@pytest.mark.parametrize("bad", ["store", "trainer:1:2", "sampler:1", "gpu:0", "store:-1", "ps:x"])
def test_what_is_no_role_name_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="is not a role name"):
        RoleName.parse(bad)
