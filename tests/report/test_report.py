"""``graphrun report`` on run directories as ``graphrun run`` leaves them: bad input is one
line, a failed run renders what exists, a planned run shows its prediction."""

from __future__ import annotations

import base64
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from PIL import Image

from graphrun.cli import main
from graphrun.placement.schedule import read_schedules, schedule_file
from graphrun.report.rundir import read_run
from graphrun.testing.jobs import small_job


class Page(HTMLParser):
    """The page's images, table cells and text; fails on a tag closed out of order."""

    VOID: ClassVar[set[str]] = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self, text: str) -> None:
        super().__init__()
        self.open: list[str] = []
        self.images: list[bytes] = []
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()
        assert self.open == [], self.open

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)
        a = dict(attrs)
        if tag == "img":
            src = a["src"]
            assert src.startswith("data:image/png;base64,"), src[:40]  # nothing fetched
            self.images.append(base64.b64decode(src.split(",", 1)[1]))
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (self.open, tag)
        self.open.pop()
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def check_page(path: Path) -> Page:
    page = Page(path.read_text())
    for data in page.images:
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "PNG"
            im.verify()
    return page


def epochs_table(page: Page) -> list[dict[str, str]]:
    rows = next(t for t in page.tables if t and t[0][:2] == ["epoch", "loss"])
    return [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]


def write_run(run: Path, phase: str = "Succeeded", records=(), failure=None, job_file=None):
    run.mkdir(parents=True, exist_ok=True)
    state = {"phase": phase, "conditions": [], "restarts": 0}
    if failure:
        state["failure"] = {"kind": "RoleFailed", **failure}
    if job_file:
        state["jobFile"] = str(job_file)
    (run / "state.json").write_text(json.dumps(state))
    if records:
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "launch").mkdir(exist_ok=True)
    for m, roles in (("m0", ["store:0", "trainer:0"]), ("m1", ["store:1", "trainer:1"])):
        launch = {
            "machine": m,
            "roles": [{"role": r, "kind": r.split(":")[0], "argv": ["x"]} for r in roles],
        }
        (run / "launch" / f"{m}.json").write_text(json.dumps(launch))
    return run


RECORDS = [
    {"epoch": e, "loss": 1.5 - e / 10, "train_acc": 0.5 + e / 20, "val_acc": 0.6, "test_acc": 0.61,
     "epoch_s": 2.0 - e / 10, "seeds_per_s": 1000.0 + e, "steps": 10}
    for e in range(3)
]  # fmt: skip


def test_launch_files_of_either_version_give_the_machines_roles(tmp_path):
    """Version 2 of the launch file changed ``wait_for`` (per partition); the report reads
    only the machine and its roles, so an older run's files are read as well."""
    run = write_run(tmp_path / "run", "Succeeded", RECORDS)
    for m, wait in (
        ("m0", ["127.0.0.1:1", "127.0.0.1:2"]),
        ("m1", [{"of": "partition 0", "main": ["127.0.0.1:1"], "replicas": []}]),
    ):
        data = json.loads((run / "launch" / f"{m}.json").read_text())
        if isinstance(wait[0], dict):
            data.update(format="graphrun-launch", version=2)
        (run / "launch" / f"{m}.json").write_text(json.dumps({**data, "wait_for": wait}))
    got = read_run(run)
    assert got.notes == ()
    assert [(m.name, list(map(str, m.roles))) for m in got.machines] == [
        ("m0", ["store:0", "trainer:0"]), ("m1", ["store:1", "trainer:1"]),
    ]  # fmt: skip


def test_a_directory_that_is_no_run_and_a_run_without_metrics_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"graphrun: error: {tmp_path / 'nothing'}: not a run directory (is not a directory; "
        "graphrun run writes one)"
    )
    assert main(["report", str(tmp_path)]) == 2
    assert "has no readable state.json" in capsys.readouterr().err
    run = write_run(tmp_path / "run", phase="Training")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no metrics yet" in err and "metrics.jsonl" in err
    assert "Traceback" not in err and not (run / "report.html").exists()


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"restarts": "x"}, "restarts: Expected `int`, got `str`"),
        ({"failure": "boom"}, "failure: Expected `object | null`, got `str`"),
        ({"phase": "Done"}, "phase: Invalid enum value 'Done'"),
    ],
)
def test_a_malformed_state_file_is_one_line_naming_the_field(tmp_path, capsys, change, line):
    """A state.json that is not a job status was a ValueError or AttributeError traceback."""
    run = write_run(tmp_path / "run", phase="Failed", records=RECORDS)
    state = json.loads((run / "state.json").read_text())
    (run / "state.json").write_text(json.dumps({**state, **change}))
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == f"graphrun: error: {run / 'state.json'}: {line}\n"
    assert not (run / "report.html").exists()


def test_a_failed_run_renders_what_exists_and_says_where_it_failed(tmp_path, capsys):
    run = write_run(
        tmp_path / "run", "Failed", RECORDS[:2],
        {"role": "trainer:1", "machine": "m1", "exitCode": 1, "message": "trainer:1 exited 1"},
    )  # fmt: skip
    (run / "status").mkdir()
    (run / "status" / "m1.json").write_text(json.dumps({
        "machine": "m1", "state": "failed",
        "failure": {"role": "trainer:1", "machine": "m1", "exit_code": 1,
                    "reason": "RuntimeError: out of patience"},
        "usage": {"roles": {"trainer:1": {"cpu_s": 3.5, "peak_rss_mb": 512.0}}},
    }))  # fmt: skip
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"epoch": 2, "lo\n')  # the line being written when it died
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    page = check_page(tmp_path / "r.html")
    text = " ".join(page.text)
    assert "Failed" in text and "after epoch 1" in text
    assert "trainer:1 on m1, exit code 1: RuntimeError: out of patience" in text
    assert [r["epoch"] for r in epochs_table(page)] == ["0", "1"]
    assert "line 3: not JSON (skipped)" in text
    roles = next(t for t in page.tables if t[0] == ["machine", "role", "cpu_s", "peak_rss_mb"])
    assert ["m1", "trainer:1", "3.5", "512.0"] in roles
    # a run that failed before any epoch still has a page
    run2 = write_run(tmp_path / "run2", "Failed", (), {"role": "store:0", "machine": "m0"})
    assert main(["report", str(run2)]) == 0
    assert "before its first epoch" in (run2 / "report.html").read_text()


def test_a_planned_run_shows_the_predicted_epoch_beside_the_measured_and_the_schedules(
    tmp_path, capsys
):
    job = small_job(tmp_path, nodes=400, placement={"planFile": "plan.yaml"})
    cluster = {
        "apiVersion": "graphrun.io/v1alpha1", "kind": "Cluster",
        "machines": [{"name": f"m{i}", "cpu": 16, "memory_gb": 64, "bandwidth_gbps": 1}
                     for i in range(2)],
    }  # fmt: skip
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    argv = ["plan", str(tmp_path / "cluster.yaml"), str(job), "-o", str(tmp_path / "plan.yaml")]
    assert main([*argv, "--steps", "5"]) == 0
    schedules = read_schedules(schedule_file(tmp_path / "plan.yaml"))
    run = write_run(tmp_path / "runs" / "small", "Succeeded", RECORDS, job_file=job)
    got = read_run(run)
    assert got.plan is not None and [s.label for s in got.plan.schedules] == [
        s.label for s in schedules
    ]
    assert main(["report", str(run)]) == 0
    page = check_page(run / "report.html")
    rows = next(t for t in page.tables if t[0] == ["epoch", "seconds"])
    want = {"plan, predicted": schedules[0].iteration_s * 10, "measured": (1.9 + 1.8) / 2}
    got_rows = {r[0]: float(r[1]) for r in rows[1:]}
    for label, value in want.items():
        assert got_rows[label] == pytest.approx(value, abs=1e-4)
    assert "Simulated schedule" in " ".join(page.text)
    assert len(page.images) == 3  # curves, prediction, timeline (no per-trainer records)
    # the plan's schedule file gone: the page says so, and still renders
    schedule_file(tmp_path / "plan.yaml").unlink()
    assert main(["report", str(run)]) == 0
    assert re.search(r"plan\.schedule\.json is missing", (run / "report.html").read_text())


def test_link_prediction_runs_show_auc_mrr_and_hits(tmp_path):
    recs = [
        {"epoch": e, "loss": 0.7 - e / 10, "train_auc": 0.8, "val_auc": 0.85 + e / 100,
         "test_auc": 0.84, "val_mrr": 0.4, "test_mrr": 0.41, "val_hits@10": 0.7,
         "test_hits@10": 0.71, "epoch_s": 1.0, "steps": 4}
        for e in range(2)
    ]  # fmt: skip
    run = write_run(tmp_path / "run", records=recs)
    assert main(["report", str(run)]) == 0
    table = epochs_table(check_page(run / "report.html"))
    for row, rec in zip(table, recs, strict=True):
        assert set(row) == set(rec)
        assert {k: row[k] for k in ("val_auc", "val_mrr", "test_hits@10")} == {
            k: str(rec[k]) for k in ("val_auc", "val_mrr", "test_hits@10")
        }
