"""The ports of examples/ports/: each patch applies to its upstream file (kept beside it,
at the commit its header names), changes no more lines than docs/porting.md promises, and
the patched script runs on graphrun's store at small size."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from graphrun.distributed import write_store_file
from graphrun.local.stores import start_stores
from graphrun.partition import partition_graph
from graphrun.rpc.auth import generate_keys
from graphrun.testing.graphs import community_graph

ROOT = Path(__file__).resolve().parents[2]
PORTS = ROOT / "examples" / "ports"


def changed_lines(patch: Path, skip: tuple[int, int] = (0, 0)) -> int:
    """Lines the patch changes: per hunk, the larger of its removed and added lines;
    hunks starting on upstream lines ``skip`` (first, last) are not counted."""
    total, minus, plus, counted = 0, 0, 0, True
    for line in patch.read_text().splitlines():
        if line.startswith("@@"):
            total += max(minus, plus) if counted else 0
            minus = plus = 0
            start = int(line.split()[1].split(",")[0].lstrip("-"))
            counted = not skip[0] <= start <= skip[1]
        elif line.startswith("-") and not line.startswith("---"):
            minus += 1
        elif line.startswith("+") and not line.startswith("+++"):
            plus += 1
    return total + (max(minus, plus) if counted else 0)


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
@pytest.mark.timeout(600)
def test_pyg_reddit_port_trains_on_the_store(tmp_path) -> None:
    script = tmp_path / "examples" / "reddit.py"
    apply(PORTS / "pyg_reddit.patch", PORTS / "upstream" / "pyg_reddit.py", script)
    assert "num_workers': 6" in script.read_text()  # the workers, as shipped
    graph = community_graph(600, 3000, seed=0, feat_dim=8)
    partition_graph(graph, tmp_path / "parts", 2, method="metis", seed=0)
    key = tmp_path / "parts" / "store.key"
    generate_keys(key)  # as `graphrun serve parts/` makes it: a default, keyed store
    with start_stores(tmp_path / "parts", 2, key_file=key) as stores:
        servers = [s.address for s in stores]
        write_store_file(tmp_path / "data" / "Reddit", servers, keys=str(key))
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=600
        )
    assert run.returncode == 0, run.stderr[-3000:]
    accs = re.findall(r"Epoch: 10, Train: [\d.]+, Val: [\d.]+, Test: ([\d.]+)", run.stdout)
    assert accs and float(accs[0]) > 0.5, run.stdout[-2000:]  # 8 classes: chance is 0.125


DGL_MODEL = (16, 138)  # upstream lines of class DistSAGE: the model, moved to PyG layers


def test_dgl_graphsage_port_changes_little_besides_the_model() -> None:
    patch = PORTS / "dgl_graphsage.patch"
    assert "3d16000b4170fa741ed9e9667f22ba84d3493026" in patch.read_text()
    upstream = (PORTS / "upstream" / "dgl_graphsage.py").read_text().splitlines()
    assert upstream[DGL_MODEL[0] - 1].startswith("class DistSAGE")
    assert upstream[DGL_MODEL[1]].startswith("def compute_acc")
    assert changed_lines(patch, skip=DGL_MODEL) <= 15
    assert "keys=keys" in patch.read_text()  # a default store admits no client without


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dgl_graphsage_port_trains_two_trainers_on_the_store(tmp_path) -> None:
    script = tmp_path / "node_classification.py"
    apply(PORTS / "dgl_graphsage.patch", PORTS / "upstream" / "dgl_graphsage.py", script)
    graph = community_graph(600, 3000, seed=0, feat_dim=8)
    nd = graph.ndata["_N"]
    nd["features"], nd["labels"] = nd.pop("feat"), nd.pop("label")  # DGL's example's names
    partition_graph(graph, tmp_path / "parts", 2, method="metis", seed=0)
    args = [
        "--graph_name", "community", "--num_epochs", "20", "--n_classes", "0",
        "--fan_out", "5,10", "--batch_size", "64", "--batch_size_eval", "1000",
        "--eval_every", "5", "--lr", "0.01",
        "--key_file", str(tmp_path / "parts" / "store.key"),
    ]  # fmt: skip
    key = tmp_path / "parts" / "store.key"
    generate_keys(key)  # as `graphrun serve parts/` makes it: a default, keyed store
    with start_stores(tmp_path / "parts", 2, key_file=key) as stores:
        ip_config = tmp_path / "ip_config.txt"
        ip_config.write_text("\n".join(s.address for s in stores) + "\n")
        env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), "--ip_config", str(ip_config), *args],
                env={**os.environ, **env, "RANK": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in range(2)
        ]
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=600)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
    accs = []
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
        accs += [float(a) for a in re.findall(r"TestAccuracy ([\d.]+)", out)]
    # each trainer scores its own 32 test nodes; 8 classes: chance is 0.125
    assert len(accs) == 2 and sum(accs) / 2 > 0.3, outs[0][-2000:]
