"""Helpers of graphrun.graph.format shared by every writer."""

from pathlib import Path

import pytest

from graphrun.errors import DatasetError
from graphrun.files import write_atomic
from graphrun.graph.format import atomic_dir


def test_write_text_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "ready.json"
    target.write_text("old\n")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]


def test_write_text_atomic_cleans_up_on_failure(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing-dir" / "x.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_under_a_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DatasetError, match=r"a-file/out: cannot create \(Not a directory\)"):
        atomic_dir(tmp_path / "a-file" / "out")
