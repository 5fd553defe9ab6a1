"""The ports of examples/ports/: each patch applies to its upstream file (kept beside it,
at the commit its header names), changes no more lines than docs/porting.md promises, and
the patched script runs on graphrun's store at small size."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from graphrun.distributed import write_store_file
from graphrun.job.stores import start_stores
from graphrun.partition import partition_graph
from graphrun.testing.graphs import community_graph

ROOT = Path(__file__).resolve().parents[2]
PORTS = ROOT / "examples" / "ports"


def changed_lines(patch: Path) -> int:
    """Lines the patch changes: per hunk, the larger of its removed and added lines."""
    total, minus, plus = 0, 0, 0
    for line in patch.read_text().splitlines():
        if line.startswith("@@"):
            total += max(minus, plus)
            minus = plus = 0
        elif line.startswith("-") and not line.startswith("---"):
            minus += 1
        elif line.startswith("+") and not line.startswith("+++"):
            plus += 1
    return total + max(minus, plus)


def apply(patch: Path, upstream: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["patch", "--quiet", "-o", str(out), str(upstream)],
        stdin=patch.open(),
        check=True,
        timeout=30,
    )


def test_pyg_reddit_port_changes_its_imports_only() -> None:
    assert changed_lines(PORTS / "pyg_reddit.patch") <= 6
    assert "5c6461b2305ad068a6d61165b3c55852a11aaa41" in (PORTS / "pyg_reddit.patch").read_text()


@pytest.mark.integration
@pytest.mark.slow
def test_pyg_reddit_port_trains_on_the_store(tmp_path) -> None:
    script = tmp_path / "examples" / "reddit.py"
    apply(PORTS / "pyg_reddit.patch", PORTS / "upstream" / "pyg_reddit.py", script)
    assert "num_workers': 6" in script.read_text()  # the workers, as shipped
    graph = community_graph(600, 3000, seed=0, feat_dim=8)
    partition_graph(graph, tmp_path / "parts", 2, method="metis", seed=0)
    with start_stores(tmp_path / "parts", 2) as stores:
        write_store_file(tmp_path / "data" / "Reddit", [s.address for s in stores])
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=600
        )
    assert run.returncode == 0, run.stderr[-3000:]
    accs = re.findall(r"Epoch: 10, Train: [\d.]+, Val: [\d.]+, Test: ([\d.]+)", run.stdout)
    assert accs and float(accs[0]) > 0.5, run.stdout[-2000:]  # 4 classes: chance is 0.25
