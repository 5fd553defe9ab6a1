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


def test_a_client_name_no_job_can_have_is_one_line(tmp_path: Path, capsys) -> None:
    """`keygen jobA.key --clients DIR` (the recipe in its help) admitted job 'jobA', a name
    no GraphJob can have (DNS-1035, lower case): the key could never be used."""
    assert main(["keygen", str(tmp_path / "store.key")]) == 0
    capsys.readouterr()
    for name in ("jobA", "1job", "job_a", "job-", "j" * 41):
        argv = [str(tmp_path / f"{name}.key"), "--store", str(tmp_path / "store.key")]
        assert main(["keygen", *argv, "--clients", str(tmp_path / "clients")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"names job {name!r}, which no job can be named" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.key"]  # nothing written


def test_the_clients_directory_is_made(tmp_path: Path, capsys) -> None:
    """The recipe `keygen job.key --store store.key --clients clients/` failed as printed:
    the directory had to exist. It is made (0700); its parent must exist."""
    assert main(["keygen", str(tmp_path / "store.key")]) == 0
    store = ["--store", str(tmp_path / "store.key")]
    clients = tmp_path / "clients"
    assert main(["keygen", str(tmp_path / "job-a.key"), *store, "--clients", f"{clients}/"]) == 0
    assert (clients / "job-a.key").is_file() and clients.stat().st_mode & 0o777 == 0o700
    capsys.readouterr()
    missing = tmp_path / "no" / "clients"
    assert main(["keygen", str(tmp_path / "job-b.key"), *store, "--clients", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"directory {missing.parent} does not exist" in err[0]
    assert not (tmp_path / "job-b.key").exists() and not missing.parent.exists()
