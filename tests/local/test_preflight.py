"""What the trainers will need is checked before any process starts (issue: hardening, 15)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from graphrun.errors import USER_ERROR_EXIT, SpecError
from graphrun.job.spec import load_job
from graphrun.local.runner import LocalJob, RunOptions
from graphrun.testing.jobs import small_job


def check(path: Path) -> None:
    LocalJob(load_job(path), path, RunOptions(), sink=io.StringIO()).check_inputs()


def test_a_good_job_passes(tmp_path: Path) -> None:
    check(small_job(tmp_path))


def test_unknown_feature_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"spec\.training\.feature: .*no feature 'feats'"):
        check(small_job(tmp_path, feature="feats"))


def test_unknown_label_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"spec\.training\.label: .*no column 'class'"):
        check(small_job(tmp_path, label="class"))


def test_unknown_target_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"spec\.training\.targetNodeType: 'paper'"):
        check(small_job(tmp_path, targetNodeType="paper"))


def test_negative_label_of_a_training_node_is_refused(tmp_path: Path) -> None:
    path = small_job(tmp_path)
    node = tmp_path / "parts" / "part-1" / "node" / "_N"
    y = np.load(node / "label.npy")
    row = int(np.flatnonzero(np.load(node / "train_mask.npy"))[3])
    y[row] = -1
    np.save(node / "label.npy", y)
    with pytest.raises(SpecError, match=rf"negative label \(first: local row {row}, label -1\)"):
        check(path)


def test_negative_label_outside_the_splits_is_fine(tmp_path: Path) -> None:
    path = small_job(tmp_path)
    node = tmp_path / "parts" / "part-0" / "node" / "_N"
    y = np.load(node / "label.npy")
    masks = [np.load(node / f"{m}_mask.npy") for m in ("train", "val", "test")]
    unlabelled = np.flatnonzero(~(masks[0] | masks[1] | masks[2]))
    y[unlabelled] = -1
    np.save(node / "label.npy", y)
    check(path)


def test_missing_split_mask_is_refused(tmp_path: Path) -> None:
    path = small_job(tmp_path)
    meta_file = tmp_path / "parts" / "partition.json"
    meta = json.loads(meta_file.read_text())
    del meta["node_features"]["_N"]["val_mask"]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(SpecError, match="no 'val_mask'"):
        check(path)


def test_entry_point_module_must_exist(tmp_path: Path) -> None:
    path = small_job(tmp_path, entryPoint="nosuchpackage.train:main")
    with pytest.raises(SpecError, match=r"spec\.training\.entryPoint: no module 'nosuchpackage"):
        check(path)


def test_entry_point_beside_the_job_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "mytrain.py").write_text("def main(ctx):\n    return 1\n")
    check(small_job(tmp_path, entryPoint="mytrain:main"))


def test_missing_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"spec\.training\.script: .*train\.py does not exist"):
        check(small_job(tmp_path, script="train.py"))


def test_checkpoint_dir_must_be_writable(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    with pytest.raises(SpecError, match=r"spec\.training\.checkpointDir: .*afile/ckpt"):
        check(small_job(tmp_path, checkpointDir="afile/ckpt"))


def test_a_failed_check_marks_the_job_failed(tmp_path: Path) -> None:
    # partitions are checked again once partitioning is done (Distributing): state says why
    path = small_job(tmp_path, feature="feats")
    job = LocalJob(load_job(path), path, RunOptions(), sink=io.StringIO())
    job.check_inputs = lambda: None  # type: ignore[method-assign]  # reach Distributing
    with pytest.raises(SpecError):
        job.run()
    state = json.loads((tmp_path / "runs" / "small" / "state.json").read_text())
    assert state["phase"] == "Failed"
    assert any(c["reason"] == "InvalidInput" for c in state["conditions"])
    assert USER_ERROR_EXIT == 2


@pytest.mark.parametrize(
    ("machines", "runtime", "named"),
    [
        (1, {"gpus": 64}, "(runtime.gpus)"),
        (2, {"gpus": 128}, "(runtime.gpus: 128 over 2 machines)"),
        (2, {"gpusPerMachine": 64}, "(runtime.gpusPerMachine)"),
    ],
)
def test_gpus_this_host_lacks_name_the_field_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], machines: int, runtime: dict[str, int],
    named: str,
) -> None:  # fmt: skip
    """`gpus: N` on a host without N GPUs names `runtime.gpus`, the field the user wrote
    (it named `runtime.gpusPerMachine`, which the job file does not have)."""
    from graphrun.cli import main

    path = small_job(tmp_path, machines=machines, runtime=runtime)
    assert main(["run", str(path)]) == USER_ERROR_EXIT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"; the job asks for 64 {named}"), err
    assert "CUDA device(s)" in err[0]
