"""A worker's SIGTERM: the whole job stops, or only this machine leaves (elastic jobs).

A worker of a job with ``runtime.elastic`` that gets SIGTERM cannot tell by itself why:
a suspended or preempted job (every worker gets it) or one pod deleted, evicted or
drained (only it). The first must write an exact checkpoint (every trainer agrees to
stop, :mod:`graphrun.train.suspend`); the second must not (the other machines' trainers
go on without this one, :mod:`graphrun.train.elastic`). So whoever stops a whole job
says so *before* signalling, with the *stop mark*:

* the operator annotates the job's pods ``graphrun.io/stop: job`` (and when, in
  ``graphrun.io/stop-at``) and deletes them a few seconds later (suspend, restart), so
  that the kubelet writes the pod's downward-API volume file
  (:data:`PODINFO_ANNOTATIONS`) while the pod still runs (a deleted pod's files are no
  longer updated);
* the local launcher (``graphrun run`` stopped, a failed attempt) writes the same line to
  the file it passes every worker (``graphrun worker --stop-mark FILE``) before it
  signals them.

The file has the downward API's format: one ``key="value"`` a line, the value quoted as
Go quotes strings (JSON-compatible for what we write). A worker given ``--stop-mark``
waits up to a bounded time for the mark after SIGTERM (the kubelet writes the file a
moment after the annotation changed); its trainers keep training meanwhile, so the wait
pauses no one. Without the mark it *leaves alone* (:func:`leaves_alone`): it kills its
roles at once (SIGKILL, no stop agreement), the other machines see its connections
drop and re-form. A worker whose launcher died (its parent changed) stops as for the
whole job: the launcher's death stops every machine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from graphrun.files import write_atomic

STOP_ANNOTATION = "graphrun.io/stop"
JOB_WIDE = "job"  # the annotation's value: the whole job stops
STOP_AT_ANNOTATION = "graphrun.io/stop-at"  # when the operator marked it (RFC 3339)
PODINFO_DIR = "/etc/graphrun/podinfo"  # the worker pods' downward-API volume
PODINFO_ANNOTATIONS = f"{PODINFO_DIR}/annotations"
# How long a worker waits for the mark after SIGTERM: the kubelet's update of a
# downward-API file lags the annotation by its pod sync (about a second when idle);
# waiting costs a leaving pod this long, not the job (its trainers train meanwhile).
MARK_WAIT_S = 10.0
# The other way the operator tells an elastic job's worker what it is for: set ("1") on
# the replacement pod of a lost machine, whose worker then runs only the machine's
# trainers (MachineLaunch.joining), which ask to be admitted at the next epoch boundary.
JOIN_ENV = "GRAPHRUN_ELASTIC_JOIN"


def write_mark(path: str | Path) -> Path:
    """Mark the whole job as stopping (the local launcher, before it signals workers)."""
    return write_atomic(path, f"{STOP_ANNOTATION}={json.dumps(JOB_WIDE)}\n")


def is_marked(path: str | Path) -> bool:
    """Whether the file at ``path`` says ``graphrun.io/stop="job"`` (no file: no)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if not eq or key.strip() != STOP_ANNOTATION:
            continue
        try:
            value = json.loads(value)
        except ValueError:
            value = value.strip().strip('"')
        if value == JOB_WIDE:
            return True
    return False


def wait_for_mark(path: str | Path, wait_s: float, interval: float = 0.1) -> bool:
    """Whether the mark is there, or appears within ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while not is_marked(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def leaves_alone(elastic: bool, marked: bool, orphaned: bool) -> bool:
    """Whether a worker told to stop (SIGTERM) while its machine trains leaves the job
    alone (kills its roles; the others go on) rather than stop it with every other
    machine (its trainers write an exact checkpoint): only in an elastic job, without
    the stop mark, and while its launcher lives."""
    return elastic and not marked and not orphaned
