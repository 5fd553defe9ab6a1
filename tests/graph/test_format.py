"""Helpers of graphrun.graph.format shared by every writer."""

from pathlib import Path

import pytest

from graphrun.files import write_atomic


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
