"""File edges of the placement package: YAML/JSON in, pydantic errors out as one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from graphrun.errors import SpecError
from graphrun.files import write_atomic

M = TypeVar("M", bound=pydantic.BaseModel)


def read_yaml(path: str | Path, what: str = "") -> Any:
    """One YAML document; every failure is one SpecError line naming the file (and, for
    bad YAML, the line). ``what`` names the file's role in the message ("job spec")."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise SpecError(f"{p}: cannot read{' ' + what if what else ''} ({reason})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{p}: not valid YAML ({where}{problem})") from None


def validate(model: type[M], data: Any, where: str) -> M:
    """``model.model_validate(data)``; the first validation error becomes one SpecError line."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = ".".join(str(x) for x in err["loc"])
        # a model validator names the field at the start of its message
        raise SpecError(f"{where}: {loc}: {msg}" if loc else f"{where}: {msg}") from exc


def write_file(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; a failure is one SpecError line."""
    try:
        return write_atomic(path, text)
    except OSError as exc:
        raise SpecError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from exc
