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


def test_a_named_command_imports_its_own_module_only(tmp_path) -> None:
    """A store server or a machine worker (hundreds of them in a suite's jobs) does not
    import every other subcommand's module to build parsers it never uses."""
    import subprocess
    import sys

    code = "import sys; from graphrun.cli import main; code = main(sys.argv[1:]); "
    code += "print(code, sorted(m for m in sys.modules if m.startswith('graphrun.cli.')))"
    argv = [sys.executable, "-c", code, "keygen", str(tmp_path / "k.key")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "0 ['graphrun.cli.keygen']"


@pytest.mark.parametrize("argv", [["--help"], ["nosuch"], ["-h", "serve"]])
def test_without_a_command_first_every_command_is_offered(argv, capsys) -> None:
    main(argv)
    out = capsys.readouterr()
    for command in ("import", "serve", "worker", "bench", "operator"):
        assert command in out.out + out.err
