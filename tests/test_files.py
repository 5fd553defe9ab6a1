"""graphrun.files: a file or a directory appears whole or not at all."""

from pathlib import Path

import pytest

from graphrun.errors import DatasetError
from graphrun.files import atomic_dir, dir_is_free


def test_atomic_dir_appears_whole_when_the_block_ends(tmp_path: Path) -> None:
    final = tmp_path / "deep" / "out"
    with atomic_dir(final) as staging:
        assert staging.parent == final.parent and staging.is_dir() and not final.exists()
        (staging / "part-0").mkdir()
        (staging / "part-0" / "a.txt").write_text("a")
    assert (final / "part-0" / "a.txt").read_text() == "a"
    assert [p.name for p in final.parent.iterdir()] == ["out"]  # no staging left


def test_atomic_dir_leaves_nothing_when_the_block_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="half way"), atomic_dir(tmp_path / "out") as staging:
        (staging / "a.txt").write_text("a")
        raise RuntimeError("half way")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_leaves_nothing_when_interrupted(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "out") as staging:
        (staging / "a.txt").write_text("a")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert dir_is_free(tmp_path / "out")
    with atomic_dir(tmp_path / "out") as staging:
        (staging / "a.txt").write_text("a")
    assert (tmp_path / "out" / "a.txt").read_text() == "a"


@pytest.mark.parametrize("existing", ["directory", "file"])
def test_atomic_dir_refuses_what_is_there_before_the_block_runs(
    tmp_path: Path, existing: str
) -> None:
    final = tmp_path / "out"
    if existing == "directory":
        final.mkdir()
        (final / "keep.txt").write_text("keep")
    else:
        final.write_text("keep")
    ran = False
    with (
        pytest.raises(DatasetError, match=r"out: already exists and is not empty"),
        atomic_dir(final, DatasetError),
    ):
        ran = True
    assert not ran
    assert (final / "keep.txt" if existing == "directory" else final).read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_under_a_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with (
        pytest.raises(DatasetError, match=r"a-file/out: cannot create \(Not a directory\)"),
        atomic_dir(tmp_path / "a-file" / "out", DatasetError),
    ):
        pass
    with (  # the default error
        pytest.raises(OSError, match=r"a-file/out: cannot create"),
        atomic_dir(tmp_path / "a-file" / "out"),
    ):
        pass


def test_atomic_dir_does_not_replace_what_appeared_meanwhile(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with pytest.raises(OSError), atomic_dir(final) as staging:
        (staging / "mine.txt").write_text("mine")
        final.mkdir()
        (final / "theirs.txt").write_text("theirs")
    assert [p.name for p in final.iterdir()] == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging directory is gone
