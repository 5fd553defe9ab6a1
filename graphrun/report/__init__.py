"""What a job did, as one HTML page: :func:`write_report` reads a run directory
(:mod:`.rundir`) and renders it (:mod:`.render`) with matplotlib plots (:mod:`.plots`).

Above the job layer (it reads what ``graphrun run`` writes) and below the CLI; it
imports no torch and no zmq.
"""

from __future__ import annotations

from pathlib import Path

from graphrun.files import write_atomic


def write_report(run_dir: Path, output: Path | None = None) -> Path:
    """Render ``run_dir`` to ``output`` (default ``RUN/report.html``); returns its path.

    UserError naming what is missing when ``run_dir`` is not a run directory or holds no
    metrics yet (a failed run renders what it has)."""
    from graphrun.report.rundir import read_run

    run = read_run(Path(run_dir))
    from graphrun.report.render import render  # matplotlib: not for a run dir refused

    page = render(run)
    out = Path(output) if output is not None else Path(run_dir) / "report.html"
    write_atomic(out, page)
    return out
