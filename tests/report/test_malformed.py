"""``graphrun report`` on a run directory it did not write, as an attacker writes one: every
malformed file is named in one line (the error, or a note in the page) and the rest is
rendered; never a traceback, never a hang, never more memory than its caps.

A file that could hang the report or fill its memory (a FIFO, ``/dev/zero``, a file over
its cap) is read by ``graphrun report`` in a process of its own, its address space
bounded; a malformed value is read by the command's ``main`` in the test's process (the
same code without a second interpreter importing matplotlib: 1.2 -> 0.15 CPU-s a case),
where a warning counts as a line on stderr. A report refused in its own process has not
imported matplotlib or the placement simulator (numba): 0.57 -> 0.26 CPU-s a refusal.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from graphrun.cli import main
from tests.report.test_report import RECORDS, check_page, write_run

DEEP = "[" * 100_000 + "]" * 100_000
MATH = "$\\frac{$<i>"  # mathtext that does not parse, and a tag
LIMIT_AS = 3 << 30  # the report's address space: a /dev/zero read ends in MemoryError
TIMEOUT_S = 60.0
# graphrun's main, then the heavy modules it imported on stdout's last line
MAIN = "import sys; from graphrun.cli import main; code = main(sys.argv[1:]); "
MAIN += "print(sorted(m for m in ('matplotlib', 'numba') if m in sys.modules)); sys.exit(code)"


def append(rel: str, line: object) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        with (run / rel).open("a") as f:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")

    return change


def write(rel: str, value: object) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        (run / rel).parent.mkdir(exist_ok=True)
        (run / rel).write_text(value if isinstance(value, str) else json.dumps(value))

    return change


def fifo(rel: str) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        (run / rel).parent.mkdir(exist_ok=True)
        (run / rel).unlink(missing_ok=True)
        os.mkfifo(run / rel)

    return change


def link(rel: str, target: str | None = None) -> Callable[[Path], None]:
    """``rel`` a symlink to ``target``, or to a status file outside the run directory."""

    def change(run: Path) -> None:
        to = Path(target) if target else run.parent / "elsewhere.json"
        if target is None:
            to.write_text(json.dumps({"machine": "m7", "roles": ["secret-role-from-elsewhere"]}))
        (run / rel).parent.mkdir(exist_ok=True)
        (run / rel).unlink(missing_ok=True)
        (run / rel).symlink_to(to)

    return change


def sparse(rel: str, size: int) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        with (run / rel).open("r+b") as f:
            f.truncate(size)

    return change


def usage(roles: object) -> dict[str, object]:
    return {"machine": "m0", "state": "done", "usage": {"roles": roles}}


TRAINER = {"rank": 0, "epoch_s": 1.0, "sample_s": 0.1}
# (id, change, the file named, exit code); exit 0: the page names it, 2: the error does
CASES = [
    ("loss-a-string", append("metrics.jsonl", {"epoch": 3, "loss": "x"}), "metrics.jsonl", 0),
    ("trainers-a-mapping", append("metrics.jsonl", {"epoch": 3, "loss": 1.0, "trainers": {"a": 1}}),
     "metrics.jsonl", 0),
    ("trainer-a-list", append("metrics.jsonl", {"epoch": 3, "loss": 1.0, "trainers": [[1]]}),
     "metrics.jsonl", 0),
    ("trainer-without-rank", append("metrics.jsonl", {"epoch": 3, "loss": 1, "trainers": [{}]}),
     "metrics.jsonl", 0),
    ("trainer-rank-mathtext",
     append("metrics.jsonl", {"epoch": 3, "loss": 1.0, "trainers": [{**TRAINER, "rank": MATH}]}),
     "metrics.jsonl", 0),
    ("trainer-time-a-string",
     append("metrics.jsonl", {"epoch": 3, "loss": 1.0, "trainers": [{**TRAINER, "epoch_s": "x"}]}),
     "metrics.jsonl", 0),
    ("metrics-line-nested-100k", append("metrics.jsonl", DEEP), "metrics.jsonl", 0),
    ("usage-a-list", write("status/m0.json", {"machine": "m0", "usage": [1]}), "status/m0.json", 0),
    ("usage-cpu-a-string", write("status/m0.json", usage({"trainer:0": {"cpu_s": "x"}})),
     "status/m0.json", 0),
    ("usage-role-a-list", write("status/m0.json", usage({"trainer:0": [1]})), "status/m0.json", 0),
    ("status-roles-a-number", write("status/m9.json", {"machine": "m9", "roles": 5}),
     "status/m9.json", 0),
    ("status-nested-100k", write("status/m0.json", DEEP), "status/m0.json", 0),
    ("launch-nested-100k", write("launch/m0.json", DEEP), "launch/m0.json", 0),
    ("launch-roles-a-mapping", write("launch/m0.json", {"machine": "m0", "roles": {"a": 1}}),
     "launch/m0.json", 0),
    ("state-nested-100k", write("state.json", DEEP), "state.json", 2),
    ("metrics-a-fifo", fifo("metrics.jsonl"), "metrics.jsonl", 2),
    ("state-a-fifo", fifo("state.json"), "state.json", 2),
    ("status-a-fifo", fifo("status/m0.json"), "status/m0.json", 0),
    ("launch-a-fifo", fifo("launch/m2.json"), "launch/m2.json", 0),
    ("metrics-linked-to-dev-zero", link("metrics.jsonl", "/dev/zero"), "metrics.jsonl", 2),
    ("status-linked-outside", link("status/m7.json"), "status/m7.json", 0),
    ("metrics-over-its-cap", sparse("metrics.jsonl", 65 << 20), "metrics.jsonl", 2),
]  # fmt: skip


# the cases that could hang or fill the memory of the process that reads them
IN_A_PROCESS = {
    "metrics-a-fifo", "state-a-fifo", "status-a-fifo", "launch-a-fifo",
    "metrics-linked-to-dev-zero", "metrics-over-its-cap",
}  # fmt: skip


def report_here(run: Path, capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``graphrun report RUN`` by the command's ``main`` in this process."""
    argv = ["report", str(run)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(argv)
    out = capsys.readouterr()
    err = out.err + "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
    return subprocess.CompletedProcess(argv, code, out.out, err)


def report(run: Path) -> subprocess.CompletedProcess[str]:
    """``graphrun report RUN`` in a process of its own (:data:`MAIN`), its address space
    bounded."""

    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))

    try:
        return subprocess.run(
            [sys.executable, "-c", MAIN, "report", str(run)], capture_output=True,
            text=True, timeout=TIMEOUT_S, preexec_fn=bound,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"graphrun report {run} still runs after {TIMEOUT_S:.0f} s")


@pytest.mark.parametrize(("case", "change", "named", "code"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_file_is_named_in_one_line_and_the_rest_renders(
    tmp_path, capsys, case, change, named, code
):
    run = write_run(tmp_path / "run", "Succeeded", RECORDS)
    change(run)
    got = report(run) if case in IN_A_PROCESS else report_here(run, capsys)
    assert "Traceback" not in got.stderr, got.stderr[-2000:]
    assert got.returncode == code, got.stderr[-2000:]
    if code == 2:
        assert got.stderr.count("\n") == 1 and not (run / "report.html").exists()
        assert got.stderr.startswith(f"graphrun: error: {run / named}: "), got.stderr
        if case in IN_A_PROCESS:
            assert got.stdout.splitlines()[-1] == "[]"
        return
    assert got.stderr == ""
    page = check_page(run / "report.html")
    text = " ".join(page.text)
    notes = [n for n in text.split(str(run)) if n.startswith(f"/{named}: ")]
    assert notes, text[-2000:]
    assert "secret-role-from-elsewhere" not in text  # nothing outside the run directory
    assert [r[0] for r in page.tables[0][1:]] == ["0", "1", "2"]  # the good epochs render


def test_the_usage_of_a_machine_with_more_than_64_roles_is_shown(tmp_path, capsys):
    # 64 trainers and a store server: a machine the spec allows (the report skipped the
    # status file of a machine with more than 64 roles)
    roles = {f"trainer:{r}": {"cpu_s": 1.5} for r in range(64)} | {"store:0": {"cpu_s": 2.0}}
    run = write_run(tmp_path / "run", "Succeeded", RECORDS)
    write("status/m0.json", usage(roles))(run)
    got = report_here(run, capsys)
    assert got.returncode == 0 and got.stderr == "", got.stderr[-2000:]
    page = check_page(run / "report.html")
    assert "status/m0.json" not in " ".join(page.text)  # no note: nothing was skipped
    table = next(t for t in page.tables if t[0] == ["machine", "role", "cpu_s", "peak_rss_mb"])
    assert ["m0", "trainer:0", "1.5", "-"] in table and ["m0", "store:0", "2.0", "-"] in table


def test_a_machine_named_in_mathtext_and_html_is_drawn_and_shown_as_written(tmp_path, capsys):
    run = write_run(tmp_path / "run", "Succeeded", RECORDS)
    write("status/m0.json", {**usage({"trainer:0": {"cpu_s": 1.5}}), "machine": MATH})(run)
    got = report_here(run, capsys)
    assert got.returncode == 0 and got.stderr == "", got.stderr[-2000:]
    page = check_page(run / "report.html")  # no <i> opened: the name is escaped
    roles = next(t for t in page.tables if t[0] == ["machine", "role", "cpu_s", "peak_rss_mb"])
    assert [MATH, "trainer:0", "1.5", "-"] in roles
    assert len(page.images) == 2  # the curves, the machines' usage with MATH on its axis
