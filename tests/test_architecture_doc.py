"""ARCHITECTURE.md stays short and true: every path it names exists, its import contracts
are those of pyproject.toml, and it stays under a line bound."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "ARCHITECTURE.md"
MAX_LINES = 300  # the page points at docstrings and docs/; it does not repeat them

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`\n]+)`")
_PATHLIKE = re.compile(r"[\w.-]+(/[\w.-]+)*/?")
_SUFFIXES = (".py", ".md", ".toml")
_ROW = re.compile(r"\| `(\w+/)` \|")
_TOP = ("graphrun/", "tests/", "docs/", "scripts/", "deploy/", "benchmarks/", "examples/")


def _paths(text: str) -> list[str]:
    """The spans in backticks (outside fenced blocks) that name a file or folder of the
    repository: a name ending in .py, .md or .toml, a folder ending in ``/``, or anything
    under a top-level folder. In a table row that begins with a package (``| `job/` |``)
    a bare name (``blame.py``) is that package's."""
    found = []
    for line in _FENCE.sub("", text).splitlines():
        row = _ROW.match(line)
        package = row.group(1) if row else ""
        for s in _SPAN.findall(line):
            if _PATHLIKE.fullmatch(s) and (s.endswith((*_SUFFIXES, "/")) or s.startswith(_TOP)):
                bare = "/" not in s.rstrip("/") and s != package
                found.append(package + s if bare else s)
    return found


def _exists(path: str) -> bool:
    """A path is relative to the repository or to ``graphrun/``."""
    return (ROOT / path).exists() or (ROOT / "graphrun" / path).exists()


def stale_paths(text: str) -> list[str]:
    """The paths a page names that the repository does not have."""
    return [p for p in _paths(text) if not _exists(p)]


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_every_path_the_page_names_exists() -> None:
    text = PAGE.read_text()
    assert len(_paths(text)) > 100  # the check reads the page's paths, not none of them
    assert stale_paths(text) == []


def test_a_made_up_path_is_caught() -> None:
    page = "see `store/client.py`, `graphrun/job/blame.py`, `docs/live.md` and `job/spec/`"
    assert stale_paths(page) == []
    made_up = "`store/nowhere.py`, `docs/gone.md`, `job/ghost/`, `scripts/none`, `blame.py`"
    assert stale_paths(made_up) == [
        "store/nowhere.py", "docs/gone.md", "job/ghost/", "scripts/none", "blame.py",
    ]  # fmt: skip
    assert stale_paths("| `job/` | the core | `blame.py`, `ghost.py` |") == ["job/ghost.py"]
    assert stale_paths("```\n`not/checked.py` in a fenced block\n```") == []


def test_the_page_lists_the_contracts_of_pyproject() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    count = len(contracts["contracts"])
    section = _section(PAGE.read_text(), "Layers and their contracts")
    said = re.search(r"holds the (\d+) contracts", section)
    assert said is not None and int(said.group(1)) == count
    assert len(re.findall(r"^\d+\. ", section, re.MULTILINE)) == count


def test_the_page_stays_short() -> None:
    lines = len(PAGE.read_text().splitlines())
    assert lines <= MAX_LINES, f"ARCHITECTURE.md has {lines} lines, more than {MAX_LINES}"
