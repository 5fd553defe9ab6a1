"""One self-contained HTML page of a run: tables and PNG plots embedded as data URIs.

:func:`render` lays out what :func:`~graphrun.report.rundir.read_run` found: the job's
outcome (and where it failed), loss and metrics per epoch, the epoch time and its parts
per trainer, CPU and peak memory per machine, which role ran where, and for a planned
job the plan's predicted epoch beside the measured one and the simulated schedules of
the plan and of co-location. Numbers in the tables are those of ``metrics.jsonl`` as
written. Nothing in the page is fetched: it opens offline.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from typing import Any

from graphrun.report import plots
from graphrun.report.rundir import Run

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
.failed { background: #fde8e8; border: 1px solid #e15759; padding: 0.6em 1em; }
.ok { background: #e8f5e9; border: 1px solid #59a14f; padding: 0.6em 1em; }
.note { color: #666; font-size: 0.85em; }
img { max-width: 100%; }
"""

EPOCH_COLUMNS = (
    "epoch", "loss", "train_acc", "val_acc", "test_acc", "train_auc", "val_auc", "test_auc",
    "val_mrr", "test_mrr", "val_hits@10", "test_hits@10", "epoch_s", "eval_s", "seeds_per_s",
    "steps", "cache_hit_rate",
)  # fmt: skip


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def cell(v: Any) -> str:
    """A metrics value as ``metrics.jsonl`` holds it (``-`` for none)."""
    return "-" if v is None else esc(v)


def _row(cells: Sequence[Any], tag: str) -> str:
    """One table row; the first cell is a label (left-aligned)."""
    return "".join(
        f'<{tag} class="l">{c}</{tag}>' if i == 0 else f"<{tag}>{c}</{tag}>"
        for i, c in enumerate(cells)
    )


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    body = "".join(f"<tr>{_row(r, 'td')}</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{_row([esc(h) for h in head], "th")}</tr>{body}</table>'


def img(data: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def measured_epoch_s(run: Run) -> float | None:
    """The measured epoch: the mean of every epoch after the first (which warms up),
    or the first when it is the only one."""
    times = [float(r["epoch_s"]) for r in run.epochs if r.get("epoch_s") is not None]
    if not times:
        return None
    rest = times[1:] or times
    return sum(rest) / len(rest)


def _outcome(run: Run) -> str:
    restarts = f", {run.restarts} restart(s)" if run.restarts else ""
    if run.failure is not None:
        last = run.epochs[-1]["epoch"] if run.epochs else None
        after = f" after epoch {last}" if last is not None else " before its first epoch"
        return (
            f'<p class="failed"><b>Failed</b>{esc(after)}{esc(restarts)}: '
            f"{esc(run.failure.line())}</p>"
        )
    cls = "ok" if run.phase == "Succeeded" else "note"
    return f'<p class="{cls}"><b>{esc(run.phase)}</b>{esc(restarts)}</p>'


def _epochs(run: Run) -> list[str]:
    if not run.epochs:
        return ["<h2>Training</h2><p>No epoch finished.</p>"]
    cols = [c for c in EPOCH_COLUMNS if any(c in r for r in run.epochs)]
    out = [
        "<h2>Loss and metrics per epoch</h2>",
        img(plots.curves(run.epochs), "loss and metrics per epoch"),
        table(cols, ([cell(r.get(c)) for c in cols] for r in run.epochs), "epochs"),
    ]
    if any(r.get("trainers") for r in run.epochs):
        out += ["<h2>Epoch time per trainer</h2>", img(plots.epoch_times(run.epochs), "epoch time")]
        last = run.epochs[-1]
        head = ["trainer", "machine", "epoch_s", "sample_s", "fetch_s", "compute_s",
                "allreduce_s", "cpu_s", "peak_rss_mb", "cache_hit_rate"]  # fmt: skip
        rows = [
            [cell(t.get("rank")), *(cell(t.get(k)) for k in head[1:])]
            for t in last.get("trainers") or []
        ]
        out += [f"<p>Epoch {esc(last['epoch'])}, each trainer:</p>", table(head, rows, "trainers")]
        out.append(
            '<p class="note">compute includes the backward pass, during which DDP\'s '
            "all-reduce runs; other is the rest of the epoch (waiting for batches).</p>"
        )
    return out


def _elastic(run: Run) -> list[str]:
    """An elastic job's story: each re-form (machines lost, where in the epoch: a step or
    its evaluation, the group left, the pause) and each re-join, from the epoch records'
    ``reforms`` and ``rejoins`` (:class:`~graphrun.record.Reformed`,
    :class:`~graphrun.record.Rejoined`)."""
    rows, lost = [], set()
    for r in run.records:
        for e in r.reforms:
            lost.update(e.lost_machines)
            where = f"{e.phase}, step {e.step}"
            what = f"{', '.join(e.lost_machines) or '-'} lost"
            rows.append([cell(r.epoch), "re-formed", esc(what), esc(where),
                         cell(e.world_size), cell(e.paused_s)])  # fmt: skip
        for j in r.rejoins:
            rows.append([cell(r.epoch), "re-joined", esc(f"{j.machine} back"), "epoch boundary",
                         cell(j.world_size), cell(j.waited_s)])  # fmt: skip
    if not rows:
        return []
    head = ["epoch", "event", "machines", "where", "world_size", "paused_s"]
    return [
        "<h2>Machines lost and re-joined</h2>",
        f"<p>Lost: {esc(', '.join(sorted(lost)) or 'none')}; the trainers re-formed without "
        "them and went on, without a restart.</p>",
        table(head, rows, "elastic"),
        '<p class="note">paused_s: from the last progress before the loss to the re-formed '
        "group; for a re-join, how long the machine's trainers waited to be let in.</p>",
    ]


def _machines(run: Run) -> list[str]:
    if not run.machines:
        return []
    out = ["<h2>Machines and roles</h2>"]
    rows = []
    for m in run.machines:
        for role in m.roles or tuple(m.usage):
            u = m.usage.get(role, {})
            cells = [cell(u.get("cpu_s")), cell(u.get("peak_rss_mb"))]
            rows.append([esc(m.name), esc(str(role)), *cells])
    out.append(table(["machine", "role", "cpu_s", "peak_rss_mb"], rows, "roles"))
    if any(m.usage for m in run.machines):
        out.append(img(plots.machine_usage(run.machines), "CPU and peak memory per machine"))
        out.append(
            "<p class=\"note\">Sampled by each machine's worker; a machine's memory adds its "
            "roles' peaks (shared memory counts in every process that maps it).</p>"
        )
    return out


def _plan(run: Run) -> list[str]:
    if run.plan is None:
        return []
    out = ["<h2>The plan</h2>", f"<p>{esc(run.plan.source)}</p>"]
    if run.plan.note:
        out.append(f'<p class="note">No simulated schedule: {esc(run.plan.note)}</p>')
    plan, co = run.plan.schedule("plan"), run.plan.schedule("co-location")
    steps = next((r.get("steps") for r in reversed(run.epochs) if r.get("steps")), None)
    measured = measured_epoch_s(run)
    if plan is not None and steps:
        rows = [("plan, predicted", plan.iteration_s * steps)]
        if co is not None:
            rows.insert(0, ("co-location, predicted", co.iteration_s * steps))
        if measured is not None:
            rows.append(("measured", measured))
        out.append(img(plots.predicted_vs_measured(rows), "predicted and measured epoch"))
        out.append(table(["epoch", "seconds"], ([esc(a), f"{b:.4f}"] for a, b in rows), "plan"))
        out.append(
            f'<p class="note">predicted: simulated seconds per iteration × {esc(steps)} steps; '
            "measured: the mean epoch after the first.</p>"
        )
    schedules = [s for s in (plan, co) if s is not None]
    if schedules:
        out.append("<h3>Simulated schedule</h3>")
        out.append(img(plots.timeline(schedules), "simulated schedule"))
    return out


def render(run: Run) -> str:
    """The page, as one string."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>graphrun report: {esc(run.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>graphrun report: {esc(run.name)}</h1>",
        f'<p class="note">{esc(run.path)}'
        + (f" — job {esc(run.job_file)}" if run.job_file else "")
        + "</p>",
        _outcome(run),
        *_epochs(run),
        *_elastic(run),
        *_machines(run),
        *_plan(run),
    ]
    if run.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in run.notes))
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
