"""The docs' code runs as written against a default (keyed) store (issue 40, item 9).

The code blocks are read from the docs themselves — the README's pipeline and its job
file, the porting guide's serving lines and PyG snippet, ``graphrun keygen``'s recipe —
and run as a user would paste them, at small size (the sizes are the only edits).
Before, the PyG snippet and the DistDGL port passed no key (refused by a default store),
the pipeline's job used neither the ``data/`` nor the ``parts/`` it had just made, and
the keygen recipe failed on a missing directory and named a job no job can be."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphrun.cli.keygen import DESCRIPTION as KEYGEN_HELP
from graphrun.distributed import load_keys
from graphrun.store.client import ClientConfig, KVClient
from graphrun.testing.procs import REPO_ROOT, child_env
from graphrun.testing.store import make_partition_dir

FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


def blocks(doc: str, heading: str, lang: str) -> list[str]:
    """The ``lang`` code blocks of the section of ``doc`` (a file of the repository)
    under ``heading``, in order."""
    text = (REPO_ROOT / doc).read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + len(heading) + 2)
    section = text[start : end if end > 0 else len(text)]
    return [body for kind, body in FENCE.findall(section) if kind == lang]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = child_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


class Shell:
    """Runs a bash block line by line in ``cwd``: ``cmd &`` in the background (stopped
    at exit), every other line to its end, which must succeed."""

    def __init__(self, cwd: Path) -> None:
        self.cwd, self.background = cwd, []

    def run(self, block: str, timeout: float = 120) -> str:
        out = []
        for line in block.splitlines():
            cmd = re.sub(r"\s+#.*$", "", line).strip()
            if not cmd or cmd.startswith("#"):
                continue
            if cmd.endswith("&"):
                quiet = subprocess.DEVNULL
                argv = ["bash", "-c", "exec " + cmd[:-1]]
                proc = subprocess.Popen(argv, cwd=self.cwd, env=_env(), stdout=quiet, stderr=quiet)
                self.background.append(proc)
                continue
            done = subprocess.run(["bash", "-c", cmd], cwd=self.cwd, env=_env(),
                                  capture_output=True, text=True, timeout=timeout)  # fmt: skip
            assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stderr[-3000:]}"
            out.append(done.stdout)
        return "".join(out)

    def stop(self) -> None:
        for p in self.background:
            p.terminate()
        for p in self.background:
            try:
                assert p.wait(timeout=30) == 0, f"a background command exited {p.returncode}"
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    sh = Shell(tmp_path)
    try:
        yield sh
    finally:
        sh.stop()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_readme_pipeline_trains_on_what_it_made(shell: Shell, tmp_path: Path) -> None:
    (steps,) = blocks("README.md", "## The pipeline, step by step", "bash")
    (job,) = blocks("README.md", "## The pipeline, step by step", "yaml")
    assert job.startswith("# job.yaml") and "graphrun run job.yaml" in steps
    small = steps.replace("--nodes 200000 --avg-degree 40", "--nodes 2000 --avg-degree 10")
    assert small != steps
    (tmp_path / "job.yaml").write_text(job.replace("epochs: 5", "epochs: 1"))
    out = shell.run(small, timeout=240)
    assert f"using the partitions in {tmp_path / 'parts'}" in out  # not partitioned again
    assert "Succeeded" in out
    metrics = (tmp_path / "runs" / "pipeline" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["epoch"] == 0


PREAMBLE = """
import torch
servers, rank, world_size = {servers!r}, 0, 1
train_ids = torch.arange(0, 200)
etype, pairs = ("_N", "_E", "_N"), torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
"""
EPILOGUE = """
batch = next(iter(loader))
assert batch.batch_size == 200 and batch.x.shape[0] >= 200, batch
link_batch = next(iter(links))
assert link_batch.edge_label.tolist() == [1.0] * 4 + [0.0] * 4, link_batch
ctx.close()
print("read", batch.x.shape[0], "rows")
"""


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_porting_guides_pyg_snippet_runs_on_a_default_store(
    shell: Shell, tmp_path: Path
) -> None:
    (serving,) = blocks("docs/porting.md", "## Keys: every client presents one", "bash")
    snippet = blocks("docs/porting.md", "## PyG: the remote-backend interfaces over the store",
                     "python")[0]  # fmt: skip
    assert "keys=keys" in snippet and "--insecure" not in serving
    port = free_port()
    small = serving.replace("--nodes 20000", "--nodes 2000").replace("7000", str(port))
    shell.run(small)
    key = tmp_path / "parts" / "store.key"
    deadline = time.monotonic() + 60
    while not key.exists():  # the store makes its key before it serves
        assert time.monotonic() < deadline, "graphrun serve made no parts/store.key"
        assert shell.background[0].poll() is None, "graphrun serve exited"
        time.sleep(0.1)
    servers = [f"tcp://127.0.0.1:{port}"]
    with KVClient(ClientConfig(servers, keys=load_keys(key), timeout=60)):
        pass  # serving: the snippet's joins need not wait
    script = tmp_path / "snippet.py"
    script.write_text(PREAMBLE.format(servers=servers) + snippet + EPILOGUE)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("read "), done.stdout


@pytest.mark.integration
def test_keygen_recipe_runs_as_printed(shell: Shell, tmp_path: Path) -> None:
    recipe = [ln.strip() for ln in KEYGEN_HELP.splitlines() if ln.startswith("  graphrun ")]
    keygen = [ln for ln in recipe if ln.startswith("graphrun keygen")]
    serve = [ln for ln in recipe if ln.startswith("graphrun serve") and "--clients" in ln]
    assert len(keygen) == 3 and len(serve) == 1  # the store's, a job's, a graph writer's
    make_partition_dir(tmp_path / "parts", 1)
    shell.run("\n".join(keygen))  # clients/ does not exist yet: keygen makes it
    job_file = next(re.finditer(r"keygen (\S+)\.key --store", keygen[1])).group(1)
    ready = tmp_path / "ready.json"
    shell.run(f"{serve[0]} --address tcp://127.0.0.1:0 --ready-file {ready} &")
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and shell.background[0].poll() is None
        time.sleep(0.1)
    address = json.loads(ready.read_text())["address"]
    keys = load_keys(tmp_path / f"{job_file}.key")
    with KVClient(ClientConfig([address], job=job_file, keys=keys, timeout=30)) as c:
        assert c.pull("node/_N/feat", [0]).shape == (1, 8)  # the job's key is admitted


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_live_graphs_worked_example_runs_as_written(shell: Shell, tmp_path: Path) -> None:
    (steps,) = blocks("docs/live.md", "## Writing: a worked example", "sh")
    example = blocks("docs/live.md", "## Writing: a worked example", "python")[0]
    ports = [free_port(), free_port()]
    small = steps.replace("--nodes 20000", "--nodes 4000")
    for doc_port, port in zip(("7100", "7101"), ports, strict=True):
        assert doc_port in steps and doc_port in example
        small, example = small.replace(doc_port, str(port)), example.replace(doc_port, str(port))
    assert small != steps and "--grants write_graph" in small
    shell.run(small)
    servers = [f"tcp://127.0.0.1:{p}" for p in ports]
    keys = load_keys(tmp_path / "writer.key")
    with KVClient(ClientConfig(servers, job="writer", keys=keys, timeout=60)):
        pass  # both serve: the example's joins need not wait
    (tmp_path / "example.py").write_text(example)
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("version 1 new nodes [4000 "), done.stdout  # ids >= num_nodes
    # node 900001's one in-edge (from 17), sampled: a new edge, its id >= num_edges
    one = re.search(r"SampledEdges\(src=array\(\[\d+\]\), seed_index=array\(\[0\]\), "
                    r"eid=array\(\[(\d+)\]\)", done.stdout)  # fmt: skip
    assert one is not None and int(one.group(1)) >= 40000, done.stdout
    assert sorted(p.name for p in (tmp_path / "live").iterdir() if p.suffix == ".wal") == [
        "part-0.wal",
        "part-1.wal",
    ]
