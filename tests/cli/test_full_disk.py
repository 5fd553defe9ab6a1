"""A full disk: one line naming the path and "no space left", and nothing left behind.

Real small tmpfs mounts (root only): generate, partition and checkpoints used to print
an OSError traceback or torch's `[enforce fail at inline_container.cc]` and leave
`.checkpoint.pt.tmp-*` files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from graphrun.errors import HostError
from graphrun.testing.procs import run_graphrun
from graphrun.testing.tmpfs import small_tmpfs

pytestmark = pytest.mark.integration


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "tiny") as mnt:
        yield mnt


def test_generate_on_a_full_disk_says_so_in_one_line(tiny_disk: Path) -> None:
    proc = run_graphrun("generate", "community", str(tiny_disk / "g"), "--nodes", "20000")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert f"{tiny_disk / 'g'}: cannot write: no space left on device" in lines[0]
    assert list(tiny_disk.iterdir()) == []


def test_partition_on_a_full_disk_says_so_in_one_line(tiny_disk: Path, tmp_path: Path) -> None:
    data = tmp_path / "g"
    assert run_graphrun("generate", "community", str(data), "--nodes", "3000").returncode == 0
    out = tiny_disk / "parts"
    proc = run_graphrun("partition", str(data), str(out), "--parts", "2")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "no space left on device" in lines[0] and str(out) in lines[0]
    assert list(tiny_disk.iterdir()) == []


def test_a_checkpoint_on_a_full_disk_is_one_line_and_leaves_no_temp_file(
    tiny_disk: Path,
) -> None:
    from graphrun.train.checkpoint import Checkpoint, save_checkpoint

    big = {"w": torch.zeros(200_000)}  # 800 kB > 256 kB
    with pytest.raises(HostError, match=r"checkpoint\.pt: cannot write: no space left on device"):
        save_checkpoint(tiny_disk / "ck", Checkpoint(0, big, {}, {}, {}))
    assert list((tiny_disk / "ck").iterdir()) == []
