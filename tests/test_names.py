"""Role names: one type formats and parses them."""

import pytest

from graphrun.names import RoleName


@pytest.mark.parametrize(
    "text, name",
    [
        ("store:3", RoleName.store(3)),
        ("store:3:1", RoleName.store(3, 1)),
        ("store:3:r", RoleName.store(3, replica=1)),
        ("store:3:r2", RoleName.store(3, replica=2)),
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


@pytest.mark.parametrize(
    "bad", ["store", "trainer:1:2", "sampler:1", "gpu:0", "store:-1", "ps:x", "store:1:r0"]
)
def test_what_is_no_role_name_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="is not a role name"):
        RoleName.parse(bad)


def test_home_partition_is_one_function_for_runtime_and_model() -> None:
    from graphrun.distributed import split
    from graphrun.names import home_partition

    assert split.home_partition is home_partition  # re-exported where it used to live
    assert [home_partition(r, 4, 2) for r in range(4)] == [0, 0, 1, 1]
    assert [home_partition(r, 2, 4) for r in range(2)] == [0, 2]


def test_a_replica_is_not_a_backup():
    assert RoleName.store(1, replica=1) != RoleName.store(1, 1)
    assert RoleName.parse("store:1:r").sub == 0
