"""A checkpoint is checked whole when it is loaded (issue 40, item 4): a malformed field
is one :class:`CheckpointError` naming the file and the field, never a trainer's
traceback (``epoch: "x"`` and a missing ``model`` were; ``position.step: -5`` and an RNG
state of any shape were taken)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from graphrun.errors import CheckpointError
from graphrun.train.checkpoint import (
    FILE,
    Checkpoint,
    load_checkpoint,
    load_states,
    save_checkpoint,
)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture
def good(tmp_path: Path) -> dict[str, Any]:
    """A real mid-epoch checkpoint of two trainers, as torch.load returns it."""
    model, opt = _model()
    position = {
        "epoch": 3, "step": 7, "rng": [torch.get_rng_state(), torch.get_rng_state()],
        "sums": torch.ones(2, 4, dtype=torch.float64),
    }  # fmt: skip
    ckpt = Checkpoint(2, model.state_dict(), opt.state_dict(), {}, {"loss": 0.5}, position)
    path = save_checkpoint(tmp_path / "ck", ckpt)
    data: dict[str, Any] = torch.load(path, weights_only=True)
    return data


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    *head, last = path.split(".")

    def change(data: dict[str, Any]) -> None:
        d = data
        for k in head:
            d = d[k]
        if value is DROP:
            del d[last]
        else:
            d[last] = value

    return change


DROP = object()
RNG = torch.get_rng_state()

CASES = [
    (_set("epoch", "x"), r"epoch: Expected `int`, got `str`"),
    (_set("epoch", 2.5), r"epoch: Expected `int`, got `float`"),
    (_set("epoch", True), r"epoch: Expected `int`, got `bool`"),
    (_set("epoch", -2), r"epoch: Expected `int` >= -1"),
    (_set("epoch", DROP), r"epoch: missing"),
    (_set("model", DROP), r"model: missing"),
    (_set("model", {}), r"model: Expected `object` of length >= 1"),
    (_set("model", [1, 2]), r"model: Expected `object`, got `array`"),
    (_set("model.weight", "w"), r"model\[\.\.\.\]: expected a tensor, got str"),
    (_set("optimizer", DROP), r"optimizer: missing"),
    (_set("optimizer", 3), r"optimizer: Expected `object`, got `int`"),
    (_set("sparse", [1]), r"sparse: Expected `object`, got `array`"),
    (_set("metrics", "m"), r"metrics: Expected `object`, got `str`"),
    (_set("position", [1]), r"position: Expected `object \| null`, got `array`"),
    (_set("position.step", -5), r"position\.step: Expected `int` >= 0"),
    (_set("position.step", "5"), r"position\.step: Expected `int`, got `str`"),
    (_set("position.step", DROP), r"position\.step: missing"),
    (_set("position.epoch", -1), r"position\.epoch: Expected `int` >= 0"),
    (_set("position.epoch", 9), r"position\.epoch is 9, not the epoch after epoch \(2\)"),
    (_set("position.rng", []), r"position\.rng: Expected `array` of length >= 1"),
    (_set("position.rng", "r"), r"position\.rng: Expected `array`, got `str`"),
    (_set("position.rng", [RNG, 5]), r"position\.rng\[1\]: expected a tensor, got int"),
    (
        _set("position.rng", [RNG, RNG[:100]]),
        r"position: rng\[1\] is a torch\.uint8 tensor of shape \(100,\)",
    ),
    (_set("position.rng", [RNG, RNG.float()]), r"position: rng\[1\] is a torch\.float32 tensor"),
    (
        _set("position.sums", torch.ones(2, 4)),
        r"position: sums is not a float64 tensor of shape \(2, 4\)",
    ),
    (
        _set("position.sums", torch.ones(3, 4, dtype=torch.float64)),
        r"position: sums is not a float64",
    ),
    (_set("position.sums", [[1.0] * 4] * 2), r"position\.sums: expected a tensor, got list"),
    (
        _set("position.sums", torch.full((2, 4), float("nan"), dtype=torch.float64)),
        r"position: sums holds a NaN",
    ),
    (_set("version", 3), r"field 'version' is 3; this graphrun reads version 1 or 2"),
    (_set("version", True), r"field 'version' is True"),
    (_set("format", "other"), r"field 'format' is 'other', not 'graphrun-checkpoint'"),
]


@pytest.mark.parametrize(("change", "says"), CASES)
def test_a_malformed_field_is_one_line_naming_it(
    tmp_path: Path, good: dict[str, Any], change: Callable[[dict[str, Any]], None], says: str
) -> None:
    data = copy.deepcopy(good)
    change(data)
    (tmp_path / "bad").mkdir()
    torch.save(data, tmp_path / "bad" / FILE)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(tmp_path / "bad")
    text = str(exc.value)
    assert text.startswith(f"{tmp_path / 'bad' / FILE}: ") and "\n" not in text, text
    assert re.search(says, text), text


def test_a_good_checkpoint_loads_as_written(tmp_path: Path, good: dict[str, Any]) -> None:
    ckpt = load_checkpoint(tmp_path / "ck")
    assert ckpt is not None and ckpt.epoch == 2 and ckpt.position is not None
    assert ckpt.position["step"] == 7
    assert torch.equal(ckpt.position["rng"][1], good["position"]["rng"][1])
    at_end = Checkpoint(4, good["model"], good["optimizer"])  # an epoch end: no position
    save_checkpoint(tmp_path / "end", at_end)
    end = load_checkpoint(tmp_path / "end")
    assert end is not None and end.epoch == 4 and end.position is None


def test_a_state_of_another_model_is_one_line_naming_it(good: dict[str, Any]) -> None:
    ckpt = Checkpoint(2, good["model"], good["optimizer"])
    other = torch.nn.Linear(5, 2)
    with pytest.raises(CheckpointError, match=r"^ck: model: does not fit this job's model \("):
        load_states(ckpt, "ck", model=other)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])
    with pytest.raises(CheckpointError, match=r"^ck: optimizer: does not fit"):
        load_states(ckpt, "ck", optimizer=opt)


def test_run_resume_with_a_malformed_checkpoint_is_one_line_before_any_work(
    tmp_path: Path, good: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """`graphrun run --resume` checks the checkpoint first: one line naming the file and
    the field, exit 2, nothing started (it was every trainer's traceback)."""
    from graphrun.cli import main

    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: graphrun.io/v1alpha1\nkind: GraphJob\nmetadata: {name: j}\n"
        "spec: {graph: {dataset: data}, runtime: {machines: 1}, "
        "training: {task: node-classification}}\n"
    )
    ckpts = tmp_path / "runs" / "j" / "checkpoints"
    ckpts.mkdir(parents=True)
    data = copy.deepcopy(good)
    data["position"]["step"] = -5
    torch.save(data, ckpts / FILE)
    before = set(tmp_path.rglob("*"))
    assert main(["run", str(job), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err == f"graphrun: error: {ckpts / FILE}: position.step: Expected `int` >= 0\n", err
    assert set(tmp_path.rglob("*")) == before
