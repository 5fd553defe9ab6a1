"""``graphrun keygen``: a PATH that names no file is one line, exit 2 (it was a traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphrun.cli import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([""], "PATH: '' names no file"),
        (["/"], "PATH: '/' names no file"),
        (["."], "PATH: '.' names no file"),
        (["{tmp}/k/"], "names no file"),
        (["{tmp}"], "is a directory; name the key file to write"),
        (["{tmp}/k", "--store", ""], "--store: '' names no file"),
    ],
)
def test_a_path_that_names_no_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    assert main(["keygen", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphrun: error: ") and says in err[0], err
    assert list(tmp_path.iterdir()) == []
