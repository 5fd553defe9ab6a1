"""The image and `scripts/install` install the same pinned packages.

There is no container engine where the tests run, so the Dockerfile is read: each of its
`pip install` lines takes the constraint file that every install line of `scripts/install`
takes, and that file is copied into the build stage before the install runs.
"""

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _installs(path: str) -> list[list[str]]:
    """The words of each line of `path` that installs graphrun itself."""
    lines = (ROOT / path).read_text().replace("\\\n", " ").splitlines()
    return [
        shlex.split(line)
        for line in lines
        if re.search(r"\bpip install\b", line)
        and not line.lstrip().startswith("#")
        and re.search(r"(-e '\.\[dev\]'|\s\.)\s*$", line)
    ]


def _constraints(words: list[str]) -> set[str]:
    """The files a pip/uv command line names with -c / --constraint."""
    found = {words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-c", "--constraint")}
    return found | {w.split("=", 1)[1] for w in words if w.startswith("--constraint=")}


def _constraint_files(path: str) -> set[str]:
    installs = _installs(path)
    assert installs, f"{path} has no line that installs graphrun"
    for words in installs:
        assert _constraints(words), f"{path}: installs without constraints: {' '.join(words)}"
    return set().union(*(_constraints(w) for w in installs))


def test_dockerfile_installs_with_the_constraints_of_scripts_install() -> None:
    ours = _constraint_files("scripts/install")
    assert ours == {"requirements/constraints.txt"}
    assert "torch==" in (ROOT / "requirements/constraints.txt").read_text()
    assert _constraint_files("Dockerfile") == ours


def test_dockerfile_copies_the_constraints_before_it_installs() -> None:
    text = (ROOT / "Dockerfile").read_text()
    install = re.search(r"^RUN pip install .*$", text, re.M)
    assert install is not None
    copies = re.findall(r"^COPY (?!--from)(.+)$", text[: install.start()], re.M)
    sources = {src for line in copies for src in line.split()[:-1]}
    assert "requirements" in sources or "requirements/constraints.txt" in sources, copies
