"""The `graphrun` command shell: errors reach the user as one line."""

import pytest

from graphrun.cli import main


def test_out_of_memory_is_one_line_and_leaves_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "huge"
    code = main(["generate", "community", str(out), "--nodes", "100000000000"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith(
        "graphrun: error: out of memory in `graphrun generate`"
    )
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".huge")]


def test_no_command_prints_help(capsys) -> None:
    assert main([]) == 2
    assert "usage: graphrun" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--version"]])
def test_version(argv, capsys) -> None:
    assert main(argv) == 0
    assert "graphrun" in capsys.readouterr().out
