"""The stop mark: a worker's SIGTERM stops the whole job, or only its machine leaves."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from graphrun.machine.stopmark import is_marked, leaves_alone, wait_for_mark, write_mark


@pytest.mark.parametrize(
    ("elastic", "marked", "orphaned", "alone"),
    [
        (True, False, False, True),  # kubectl delete pod, an eviction, a drain
        (True, True, False, False),  # suspend, restart: the operator marked the pods
        (True, False, True, False),  # the launcher died: every machine stops
        (False, False, False, False),  # not elastic: every SIGTERM stops the job
        (False, True, False, False),
    ],
)
def test_who_leaves_alone(elastic: bool, marked: bool, orphaned: bool, alone: bool) -> None:
    assert leaves_alone(elastic, marked, orphaned) is alone


def test_the_mark_in_the_downward_api_format(tmp_path: Path) -> None:
    path = tmp_path / "annotations"
    assert not is_marked(path)  # no file yet
    path.write_text('graphrun.io/roles="store:1,trainer:1"\nkubectl.kubernetes.io/x="y"\n')
    assert not is_marked(path)
    path.write_text('graphrun.io/roles="store:1"\ngraphrun.io/stop="job"\n')  # the kubelet's
    assert is_marked(path)
    path.write_text('graphrun.io/stop="later"\n')
    assert not is_marked(path)
    path.write_text("graphrun.io/stop=job\n")  # unquoted: still read
    assert is_marked(path)
    write_mark(path)  # the local launcher's, read the same way
    assert path.read_text() == 'graphrun.io/stop="job"\n' and is_marked(path)


def test_waiting_for_a_late_mark(tmp_path: Path) -> None:
    path = tmp_path / "annotations"
    assert not wait_for_mark(path, 0.2, interval=0.02)
    timer = threading.Timer(0.2, write_mark, (path,))
    timer.start()
    try:
        assert wait_for_mark(path, 30.0, interval=0.02)  # the kubelet's update lag
    finally:
        timer.cancel()
