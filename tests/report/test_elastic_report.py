"""The report of an elastic job tells its story: machines lost, re-forms, re-joins."""

from __future__ import annotations

from graphrun.cli import main
from tests.report.test_report import RECORDS, check_page, write_run


def test_an_elastic_run_shows_its_lost_machines_re_forms_and_re_joins(tmp_path):
    reform = {
        "event": "reformed", "generation": 1, "epoch": 1, "step": 10, "phase": "evaluation",
        "lost_trainers": [1], "lost_machines": ["m1"], "world_size": 2,
        "machines": ["m0", "m2"], "paused_s": 3.2,
    }  # fmt: skip
    rejoin = {"event": "rejoined", "machine": "m1", "trainers": [1], "world_size": 3,
              "waited_s": 0.9}  # fmt: skip
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
    # a run without re-forms has no such section; malformed entries are passed over
    plain = write_run(tmp_path / "plain", records=[{**RECORDS[0], "reforms": "x"}])
    assert main(["report", str(plain), "-o", str(tmp_path / "p.html")]) == 0
    assert "Machines lost" not in (tmp_path / "p.html").read_text()
