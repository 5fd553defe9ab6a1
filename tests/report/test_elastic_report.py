"""The report of an elastic job tells its story: machines lost, re-forms, re-joins."""

from __future__ import annotations

from graphrun.cli import main
from graphrun.record import Reformed, Rejoined
from graphrun.wire import to_builtins
from tests.report.test_report import RECORDS, check_page, write_run

REFORM = Reformed(
    generation=1, epoch=1, step=10, phase="evaluation", lost_trainers=[1], lost_machines=["m1"],
    world_size=2, machines=["m0", "m2"], paused_s=3.2, time=1e9,
)  # fmt: skip


def test_an_elastic_run_shows_its_lost_machines_re_forms_and_re_joins(tmp_path):
    reform = to_builtins(REFORM)
    rejoin = to_builtins(Rejoined(
        machine="m1", trainers=[1], generation=2, epoch=2, world_size=3,
        machines=["m0", "m1", "m2"], waited_s=0.9, time=1e9,
    ))  # fmt: skip
    records = [
        {**RECORDS[0], "world_sizes": [[0, 3]]},
        {**RECORDS[1], "world_sizes": [[0, 3], [10, 2]], "reforms": [reform]},
        {**RECORDS[2], "world_sizes": [[0, 3]], "rejoins": [rejoin]},
    ]
    run = write_run(tmp_path / "run", records=records)
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    page = check_page(tmp_path / "r.html")
    text = " ".join(page.text)
    assert "Lost: m1" in text
    rows = next(t for t in page.tables if t[0][:2] == ["epoch", "event"])
    assert rows[1:] == [
        ["1", "re-formed", "m1 lost", "evaluation, step 10", "2", "3.2"],
        ["2", "re-joined", "m1 back", "epoch boundary", "3", "0.9"],
    ]
    # a run without re-forms has no such section; a record with a malformed one is
    # skipped, named on the page
    bad = {**RECORDS[1], "reforms": [{**reform, "lost_machines": "m1"}]}
    plain = write_run(tmp_path / "plain", records=[RECORDS[0], bad])
    assert main(["report", str(plain), "-o", str(tmp_path / "p.html")]) == 0
    page = (tmp_path / "p.html").read_text()
    assert "Machines lost" not in page
    assert "line 2: reforms[0].lost_machines: Expected `array`, got `str`" in page


def test_a_re_form_written_before_evaluation_re_forms_reads_as_one_in_training(tmp_path):
    old = {k: v for k, v in to_builtins(REFORM).items() if k != "phase"}
    run = write_run(tmp_path / "run", records=[RECORDS[0], {**RECORDS[1], "reforms": [old]}])
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    rows = next(t for t in check_page(tmp_path / "r.html").tables if t[0][:2] == ["epoch", "event"])
    assert rows[1:] == [["1", "re-formed", "m1 lost", "training, step 10", "2", "3.2"]]
