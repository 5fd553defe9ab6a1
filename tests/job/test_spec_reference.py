"""docs/graphjob-spec.md: every GraphJob field, generated from the models, never stale."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from graphrun.job.spec import graphjob_json_schema
from graphrun.job.spec.reference import reference

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "graphjob-spec.md"


def _rows() -> dict[str, list[str]]:
    """The rows of the reference the models make now, by field path."""
    out = {}
    for line in reference().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0].strip("`")] = cells
    return out


def test_the_committed_reference_is_what_the_models_make() -> None:
    assert DOC.read_text() == reference(), "stale: run .venv/bin/python scripts/spec-reference"


def test_the_script_checks_it() -> None:
    script = str(ROOT / "scripts" / "spec-reference")
    got = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr


def test_every_field_of_every_model_has_a_row_with_type_and_description() -> None:
    schema = graphjob_json_schema()
    rows = _rows()
    named = {path.rsplit(".", 1)[-1] for path in rows}
    sections = set(re.findall(r"^## `(?:spec\.)?([^`]+)`", reference(), re.M))
    for name, model in [("GraphJob", schema), *schema["$defs"].items()]:
        missing = set(model.get("properties", {})) - named - sections
        assert not missing, f"{name}: {missing} have no row"
    for path, (_, type_, _, _, description) in rows.items():
        assert type_ and description, f"{path}: a field needs a type and a description"


def test_rows_say_type_default_and_bounds() -> None:
    rows = _rows()
    assert rows["spec.runtime.machines"][1:4] == ["integer", "`1`", "> 0, <= 1024"]
    assert rows["spec.runtime.gpus"][1:4] == ["integer", "", "> 0, <= 8192"]
    assert rows["spec.training.fanouts"][2] == "`[25, 10]`"  # a factory's default
    assert rows["spec.graph.store.addresses"][2] == "*required*"
    assert rows["spec.placement.plan.demands.<key>.cpu"][1] == "number"
    assert rows["spec.runPolicy.cleanPodPolicy"][1] == '`"Running"` \\| `"All"` \\| `"None"`'


def test_it_is_linked_from_the_readme_and_the_kubernetes_guide() -> None:
    for doc in ("README.md", "docs/kubernetes.md"):
        assert "graphjob-spec.md" in (ROOT / doc).read_text(), doc
