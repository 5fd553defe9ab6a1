import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from graphrun.errors import ArgumentError
from graphrun.names import PolicyName
from graphrun.store.policy import PartitionPolicy
from graphrun.store.shm import SegmentStore, attach, clean_stale, instance_prefix, owner_alive


def test_policy_owner_and_local_rows():
    pol = PartitionPolicy(PolicyName.node("_N"), np.array([0, 3, 3, 10]))
    ids = pol.check_ids([0, 2, 3, 9])
    np.testing.assert_array_equal(pol.to_part(ids), [0, 0, 2, 2])
    np.testing.assert_array_equal(pol.to_local(np.array([3, 9]), 2), [0, 6])
    assert pol.part_rows(1) == 0 and pol.num_rows == 10
    with pytest.raises(ArgumentError, match=r"ids\[1\] = 10 is out of range \[0, 10\)"):
        pol.check_ids([1, 10])
    with pytest.raises(ArgumentError, match="integer"):
        pol.check_ids([0.5])


def test_segments_are_unique_shared_and_removed(tmp_path):
    a, b = SegmentStore(tmp_path), SegmentStore(tmp_path)
    assert a.prefix != b.prefix and a.prefix.startswith(f"graphrun-{os.getpid()}-")
    name, arr = a.copy_in(np.arange(12, dtype=np.int64).reshape(3, 4))
    view = attach(tmp_path, name, "int64", (3, 4), writable=False)
    arr[1, 1] = 99
    assert view[1, 1] == 99 and not view.flags.writeable
    empty_name, empty = a.create("float32", (0, 5))
    assert empty.shape == (0, 5)
    a.close()
    assert not (tmp_path / name).exists() and not (tmp_path / empty_name).exists()
    assert view[1, 1] == 99  # a mapping outlives the unlink


def test_stale_segments_of_dead_owner_are_cleaned(tmp_path):
    code = (
        "import sys; from graphrun.store.shm import SegmentStore; from pathlib import Path;"
        "s = SegmentStore(Path(sys.argv[1])); print(s.create('int8', (4,))[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    dead = out.stdout.strip()  # the child exited without closing its store
    assert (tmp_path / dead).exists() and not owner_alive(dead)
    mine = SegmentStore(tmp_path)
    live, _ = mine.create("int8", (4,))
    (tmp_path / "unrelated").write_text("x")
    assert clean_stale(tmp_path) == [dead]
    assert (tmp_path / live).exists() and (tmp_path / "unrelated").exists()
    mine.close()


def test_prefix_names_a_live_owner():
    assert owner_alive(instance_prefix() + ".0")


def test_mapped_segments_hold_no_file_descriptor(tmp_path):
    """Python's mmap kept a duplicate fd per segment: the 226th `init` failed at ulimit 256."""
    import gc
    import os

    from graphrun.store.shm import SegmentStore, attach

    before = len(os.listdir("/proc/self/fd"))
    store = SegmentStore(tmp_path)
    arrays = [store.create("float32", (64, 4))[1] for _ in range(300)]
    names = list(store.created)
    views = [attach(tmp_path, n, "float32", (64, 4), False) for n in names[:50]]
    assert len(os.listdir("/proc/self/fd")) - before < 5
    arrays[7][3] = 2.5
    assert float(views[7][3, 0]) == 2.5 and not views[7].flags.writeable
    del arrays, views
    gc.collect()
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_a_dead_owner_not_yet_reaped_is_dead(tmp_path):
    """A store killed with its machine is a zombie until someone reaps it (its parent
    died too: PID 1 may never do it); its segments are stale all the same."""
    code = (
        "import sys; from graphrun.store.shm import SegmentStore; from pathlib import Path;"
        "s = SegmentStore(Path(sys.argv[1])); print(s.create('int8', (4,))[0], flush=True);"
        "sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdin is not None
    seg = child.stdout.readline().strip()
    assert owner_alive(seg)
    child.stdin.close()  # it exits; not waited for, so a zombie
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert not owner_alive(seg)
        assert clean_stale(tmp_path) == [seg]
    finally:
        child.wait()
