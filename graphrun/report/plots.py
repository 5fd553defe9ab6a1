"""The report's pictures, drawn with matplotlib's Agg canvas (no display, no pyplot state).

Every function takes plain data (epoch records, machines, schedules) and returns PNG
bytes, drawing text from the run's files (machine and role names) as written: ``$`` is
not mathtext there, nor anything LaTeX (:func:`plain`). :func:`timeline_bars` is the
pure part of the timeline (which bar goes on which row), so a test can hold the drawing
to the simulator's schedule.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from graphrun.placement.schedule import Schedule
from graphrun.report.rundir import Machine

P = ParamSpec("P")

PARTS = ("sample", "fetch", "compute", "allreduce", "other")
COLORS = {
    "sample": "#4e79a7", "fetch": "#f28e2b", "compute": "#59a14f", "allreduce": "#e15759",
    "other": "#bab0ac", "structure": "#76b7b2", "feature": "#f28e2b", "batch": "#edc948",
    "train": "#59a14f", "serve": "#b07aa1", "serve-charge": "#d4a6c8", "update": "#9c755f",
    "gradient": "#e15759", "parameters": "#ff9da7", "store": "#b07aa1", "trainer": "#59a14f",
    "sampler": "#4e79a7", "ps": "#9c755f",
}  # fmt: skip


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


def short(name: str, width: int = 16) -> str:
    """A name as a tick label: at most ``width`` characters (the tables have it whole)."""
    return name if len(name) <= width else name[: width - 1] + "…"


def _epoch_axis(ax: Axes) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


MAX_MARKERS = 200  # epochs drawn with a marker each (beyond, lines only)
MAX_LEGEND = 16  # trainers named in a legend


def plain(draw: Callable[P, bytes]) -> Callable[P, bytes]:
    """``draw`` with text drawn as written, neither mathtext nor LaTeX (a machine named
    ``$\\frac{$`` was a mathtext error). Tick labels are made as :func:`png` saves."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> bytes:
        with rc_context({"text.parse_math": False, "text.usetex": False}):
            return draw(*args, **kwargs)

    return drawn


def png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


@plain
def curves(epochs: Sequence[dict[str, Any]]) -> bytes:
    """The loss, and each metric per split, per epoch."""
    fig = Figure(figsize=(10, 3.6))
    x = [r["epoch"] for r in epochs]
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(x, [_num(r.get("loss")) for r in epochs], marker="o", color="#4e79a7")
    ax.set(title="training loss", xlabel="epoch", ylabel="loss")
    ax = fig.add_subplot(1, 2, 2)
    for metric in ("acc", "auc", "mrr", "hits@10"):
        for split, style in (("train", ":"), ("val", "--"), ("test", "-")):
            key = f"{split}_{metric}"
            pts = [(r["epoch"], r[key]) for r in epochs if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", label=key)
    ax.set(title="metrics", xlabel="epoch")
    if ax.lines:
        ax.legend(fontsize=8)
    for a in fig.axes:
        a.grid(alpha=0.3)
        _epoch_axis(a)
    return png(fig)


def trainer_parts(t: dict[str, Any]) -> dict[str, float]:
    """One trainer's epoch in parts: sampling, fetching, compute without the all-reduce,
    the all-reduce, and the rest of the epoch (waiting for batches, progress)."""
    get = {k: float(t.get(f"{k}_s") or 0.0) for k in ("epoch", *PARTS[:4])}
    compute = max(get["compute"] - get["allreduce"], 0.0)
    busy = get["sample"] + get["fetch"] + get["compute"]
    return {
        "sample": get["sample"], "fetch": get["fetch"], "compute": compute,
        "allreduce": get["allreduce"], "other": max(get["epoch"] - busy, 0.0),
    }  # fmt: skip


@plain
def epoch_times(epochs: Sequence[dict[str, Any]]) -> bytes:
    """Epoch time per trainer per epoch, and each trainer's mean epoch in parts."""
    fig = Figure(figsize=(10, 3.6))
    ax = fig.add_subplot(1, 2, 1)
    x = [r["epoch"] for r in epochs]
    marker = "o" if len(epochs) <= MAX_MARKERS else None
    lines: dict[int, list[tuple[int, float]]] = {}
    for r in epochs:
        for t in r.get("trainers") or []:
            lines.setdefault(t["rank"], []).append((r["epoch"], _num(t.get("epoch_s"))))
    for rank, pts in sorted(lines.items()):
        ax.plot(*zip(*pts, strict=True), marker=marker, label=f"trainer {rank}")
    if not lines:
        ax.plot(x, [_num(r.get("epoch_s")) for r in epochs], marker=marker, label="job")
    ax.set(title="epoch time", xlabel="epoch", ylabel="seconds")
    _epoch_axis(ax)
    if len(ax.lines) <= MAX_LEGEND:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = fig.add_subplot(1, 2, 2)
    means = breakdown_means(epochs)
    left = [0.0] * len(means)
    labels = [f"trainer {r}" for r in means]
    for part in PARTS:
        vals = [m[part] for m in means.values()]
        ax.barh(labels, vals, left=left, color=COLORS[part], label=part)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set(title="mean epoch per trainer", xlabel="seconds")
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png(fig)


def breakdown_means(epochs: Sequence[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Rank -> its epoch's parts averaged over the epochs."""
    sums: dict[int, dict[str, float]] = {}
    counts: dict[int, int] = {}
    for r in epochs:
        for t in r.get("trainers") or []:
            parts = trainer_parts(t)
            acc = sums.setdefault(t["rank"], dict.fromkeys(PARTS, 0.0))
            for k, v in parts.items():
                acc[k] += v
            counts[t["rank"]] = counts.get(t["rank"], 0) + 1
    return {
        rank: {k: v / counts[rank] for k, v in acc.items()} for rank, acc in sorted(sums.items())
    }


@plain
def machine_usage(machines: Sequence[Machine]) -> bytes:
    """CPU seconds and peak memory per machine, stacked by kind of role."""
    fig = Figure(figsize=(10, 3.2))
    names = [short(m.name) for m in machines]
    for i, (key, title, unit) in enumerate(
        (("cpu_s", "CPU per machine", "CPU seconds"),
         ("peak_rss_mb", "peak memory per machine", "MiB (roles' peaks added)"))
    ):  # fmt: skip
        ax = fig.add_subplot(1, 2, i + 1)
        by_kind: dict[str, list[float]] = {}  # kind -> its roles' sum on each machine
        for m_i, m in enumerate(machines):
            for role, u in m.usage.items():
                by_kind.setdefault(role.kind, [0.0] * len(machines))[m_i] += float(u.get(key, 0.0))
        bottom = [0.0] * len(machines)
        for kind, vals in sorted(by_kind.items()):
            ax.bar(range(len(machines)), vals, bottom=bottom, color=COLORS.get(kind, "#888"),
                   label=kind)  # fmt: skip
            bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
        ax.set(title=title, ylabel=unit)
        ax.set_xticks(range(len(names)), names)
        if by_kind:
            ax.legend(fontsize=8)
    return png(fig)


@dataclass(frozen=True)
class Bar:
    row: str  # a machine (tasks) or "src → dst" (flows on that link)
    start: float
    end: float
    stage: str
    label: str  # the role, or the roles at both ends of a flow


def timeline_bars(s: Schedule) -> tuple[list[str], list[Bar]]:
    """The rows (machines, then links) and bars of a schedule's timeline."""
    links = [f"{a} → {b}" for a, b in s.links()]
    bars = [Bar(t.machine, t.start, t.end, t.stage, str(t.role)) for t in s.tasks]
    bars += [
        Bar(f"{f.src} → {f.dst}", f.start, f.end, f.stage, f"{f.src_role} → {f.dst_role}")
        for f in s.flows
    ]
    return [*s.machines, *links], bars


def draw_timeline(ax: Axes, s: Schedule, xlabel: bool = True) -> list[Bar]:
    """The bars of :func:`timeline_bars` on ``ax``: one row per machine and link, a lane
    per stage within a row (so a flow beside a task of another stage stays visible)."""
    rows, bars = timeline_bars(s)
    y = {r: i for i, r in enumerate(rows)}
    lanes: dict[str, list[str]] = {r: [] for r in rows}
    for b in bars:
        if b.stage not in lanes[b.row]:
            lanes[b.row].append(b.stage)
    seen: set[str] = set()
    for b in bars:
        n = len(lanes[b.row])
        height = 0.8 / n
        centre = y[b.row] - 0.4 + height * (lanes[b.row].index(b.stage) + 0.5)
        label = b.stage if b.stage not in seen else None
        seen.add(b.stage)
        ax.barh(
            centre, b.end - b.start, left=b.start, height=height * 0.9,
            color=COLORS.get(b.stage, "#888"), alpha=0.8, edgecolor="white", linewidth=0.3,
            label=label,
        )  # fmt: skip
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_title(f"{s.label}: {s.iterations} iterations in {s.makespan:.3f} s (simulated)")
    if xlabel:
        ax.set_xlabel("seconds")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return bars


@plain
def timeline(schedules: Sequence[Schedule]) -> bytes:
    """The schedules one above the other, on one time axis (tasks per machine, flows per
    link)."""
    heights = [1 + 0.35 * len(timeline_bars(s)[0]) for s in schedules]
    fig = Figure(figsize=(11, sum(heights) + 0.5))
    axes = fig.subplots(len(schedules), 1, sharex=True, height_ratios=heights, squeeze=False)
    for i, (ax, s) in enumerate(zip(axes[:, 0], schedules, strict=True)):
        draw_timeline(ax, s, xlabel=i == len(schedules) - 1)
    return png(fig)


@plain
def predicted_vs_measured(rows: Sequence[tuple[str, float]]) -> bytes:
    """Bars of epoch seconds: the plan's prediction(s) and the measured epoch."""
    fig = Figure(figsize=(6, 2.6))
    ax = fig.add_subplot(1, 1, 1)
    labels = [r[0] for r in rows]
    ax.barh(labels, [r[1] for r in rows], color=["#bab0ac", "#4e79a7", "#59a14f"][: len(rows)])
    for i, (_, v) in enumerate(rows):
        ax.text(v, i, f" {v:.3f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.25)
    ax.set(title="epoch: predicted and measured", xlabel="seconds")
    return png(fig)
