"""``graphrun ingest``: arguments checked before anything is read or connected, a dry run
that reads and checks every chunk with progress, one line for a bad chunk.

The call through ``GraphWriter`` into a live store (refusals, what is committed) is in
test_ingest_live.py, on real servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graphrun.cli import main
from graphrun.cli.ingest import MAX_CHUNK_ROWS, MAX_WINDOW, Progress
from graphrun.graph import ingest_tables
from graphrun.graph.ingest_tables import EdgeChunk
from graphrun.testing.procs import fresh_python


@pytest.fixture
def src(tmp_path):
    (tmp_path / "nodes.csv").write_text("id,label\n" + "".join(f"{i},{i % 2}\n" for i in range(5)))
    (tmp_path / "edges.csv").write_text("src,dst\n0,1\n1,2\n2,3\n")
    return tmp_path


def test_dry_run_reads_every_chunk_with_progress(src, capsys):
    assert main(["ingest", str(src), "--dry-run", "--chunk-rows", "2", "--progress-s", "0"]) == 0
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 5  # one progress line a chunk: 3 of nodes, 2 of edges
    assert err.splitlines()[-1].startswith("ingest: 8 rows (5 nodes, 3 edges) in 5 chunks, ")
    assert out.startswith(f"ingested {src}: 8 rows (5 nodes, 3 edges) in 5 chunks, ")
    assert out.rstrip().endswith("rows/s checked (dry run, nothing sent)")


def test_a_bad_chunk_is_one_line_and_exit_2(src, capsys):
    (src / "edges.csv").write_text("src,dst\n0,1\n1,2\n2,x\n")
    assert main(["ingest", str(src), "--dry-run", "--chunk-rows", "2"]) == 2
    *progress, err = capsys.readouterr().err.splitlines()
    assert all(line.startswith("ingest: ") for line in progress)
    assert err.startswith(f"graphrun: error: {src / 'edges.csv'}: column 'dst' has type string")
    assert "before it: 5 rows (5 nodes, 0 edges) in 3 chunks" in err  # csv typed 'dst' a string


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--chunk-rows", "0"], "argument --chunk-rows: 0 is not in [1, 2097152]"),
        (["--chunk-rows", "3000000"], "argument --chunk-rows: 3000000 is not in"),
        (["--window", "0"], "argument --window: 0 is not in [1, 16]"),
        (["--window", "17"], "argument --window: 17 is not in [1, 16]"),
        (["--timeout", "0"], "argument --timeout: 0 is not in (0, 3600]"),
        (["--store", "host"], "argument --store: 'host' is not host:port"),
        ([], "--store: give the main server of every partition"),
        (["--store", "127.0.0.1:7000"], "--key-file: give a key with the write_graph grant"),
    ],
)
def test_arguments_checked_before_anything(src, capsys, argv, line):
    assert main(["ingest", str(src), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and line in err


def test_key_and_layout_checked_before_connecting(src, tmp_path, capsys):
    store = ["--store", "127.0.0.1:9"]  # nothing listens: a connection would time out
    assert main(["ingest", str(src), *store, "--key-file", str(tmp_path / "no.key")]) == 2
    assert "no.key: cannot read key file" in capsys.readouterr().err
    key = tmp_path / "w.key"
    assert main(["keygen", str(key)]) == 0
    (src / "edges.csv").write_text("from,to\n1,2\n")
    assert main(["ingest", str(src), *store, "--key-file", str(key), "--timeout", "1"]) == 2
    assert "edges.csv: column 'src' is missing" in capsys.readouterr().err


def test_the_command_bounds_are_the_reader_and_writer_bounds():
    from graphrun.distributed import writer

    assert MAX_CHUNK_ROWS == ingest_tables.MAX_CHUNK_ROWS
    assert MAX_WINDOW == writer.MAX_WINDOW


def test_help_does_not_import_pyarrow():
    code = "import sys; from graphrun.cli import build_parser; build_parser(); "
    code += "print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("up_s", [100.0, 1e6], ids=["booted-a-minute-ago", "up-for-days"])
def test_progress_counts_versions(monkeypatch, up_s):
    """The first line at once, then every ``every`` s: also on a machine up for less
    than ``every`` (``perf_counter`` counts from the boot: the first line waited until
    the uptime passed it, and this test failed in the first hour of a box's life)."""
    import io
    import time

    monkeypatch.setattr(time, "perf_counter", lambda: up_s)
    out = io.StringIO()
    p = Progress(every=3600.0, out=out)
    edges = EdgeChunk(Path("e"), np.arange(2), "r", np.arange(2), np.arange(2))
    p.add(edges, 4)
    p.add(edges, 5)
    assert out.getvalue().count("\n") == 1  # the first, then not before an hour
    assert p.line().startswith("4 rows (0 nodes, 4 edges) in 2 chunks, versions 4..5, ")


def test_the_writer_imports_no_torch():
    """A process that only writes the graph (``graphrun ingest``) imports the writer and its
    client, and not torch or torch_geometric (3.8 CPU-s and 400 MB before its first batch,
    through graphrun.distributed's names); those load on first use of a name that needs them."""
    code = (
        "import sys\n"
        "from graphrun.cli.ingest import Sender, _writer\n"
        "from graphrun.distributed.writer import GraphWriter\n"
        "from graphrun.store.client import KVClient\n"
        "print(sorted(m for m in ('torch', 'torch_geometric') if m in sys.modules))\n"
        "from graphrun.distributed import DistGraph\n"
        "print('torch' in sys.modules)\n"
    )
    assert fresh_python(code, timeout=120).split("\n")[:2] == ["[]", "True"]


def test_the_command_keeps_large_allocations(src):
    """Freed buffers of a few 100 KB (a chunk's arrays, a batch's pieces) are kept for the
    next chunk, as in ``graphrun serve`` (the writer imported torch once, whose start-up
    raised glibc's mmap threshold by the way; without it a 10k-edge batch's plan took
    0.9 ms of CPU for 0.4, most of it page faults)."""
    code = (
        "import os\n"
        "from graphrun.cli import main\n"
        "from graphrun.rpc import tuning\n"
        f"assert main(['ingest', {str(src)!r}, '--dry-run']) == 0\n"
        "print(os.getpid() in tuning._started)\n"
    )
    assert fresh_python(code).split("\n")[-2] == "True"
