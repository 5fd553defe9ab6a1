"""`graphrun operator` with bad arguments: one line, exit 2 (no cluster needed)."""

from pathlib import Path

import pytest

from graphrun.cli import main


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--resync", "nan"], "--resync: must be > 0"),
        (["--resync", "0"], "--resync: must be > 0"),
        (["--kubeconfig", "{dir}/missing"], "missing: no Kubernetes configuration"),
        (["--kubeconfig", "{dir}/bad.yaml"], "bad.yaml: no Kubernetes configuration"),
    ],
)
def test_bad_arguments(
    argv: list[str], match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.yaml").write_text("{bad\n")
    assert main(["operator", *[a.replace("{dir}", str(tmp_path)) for a in argv]]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert match in line
