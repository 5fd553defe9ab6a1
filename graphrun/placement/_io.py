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


MAX_YAML_BYTES = 16 << 20  # a job, cluster or plan file; far larger ones are not specs
MAX_YAML_DEPTH = 64  # nesting of mappings and lists (a GraphJob needs about 10)
MAX_YAML_NODES = 1_000_000  # values, aliases counted as often as they are used


def read_yaml(path: str | Path, what: str = "") -> object:
    """One YAML document; every failure is one SpecError line naming the file (and, for
    bad YAML, the line). ``what`` names the file's role in the message ("job spec").

    The one place graphrun reads YAML files: files over ``MAX_YAML_BYTES``, nesting
    deeper than ``MAX_YAML_DEPTH`` (100k levels hit Python's recursion limit in the
    parser) and aliases expanding beyond ``MAX_YAML_NODES`` values are refused too."""
    p = Path(path)
    label = f" {what}" if what else ""
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
        text = raw.decode()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise SpecError(f"{p}: cannot read{label} ({reason})") from None
    if len(raw) > MAX_YAML_BYTES:
        raise SpecError(
            f"{p}: larger than {MAX_YAML_BYTES >> 20} MiB: not a{label or ' spec'} file"
        )
    return parse_yaml(text, str(p))


def parse_yaml(text: str, source: str) -> object:
    """``yaml.safe_load(text)`` within the bounds of :func:`read_yaml`; ``source`` names
    the text in errors."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{source}: not valid YAML ({where}{problem})") from None
    except RecursionError:
        raise SpecError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    _check_shape(data, source)
    return data


def _check_shape(data: Any, source: str) -> None:
    """Depth and size of parsed YAML, walked without recursion (aliases expanded)."""
    stack = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_YAML_NODES:
            raise SpecError(
                f"{source}: more than {MAX_YAML_NODES} values (aliases expanded): not a spec"
            )
        if isinstance(value, dict | list):
            if depth > MAX_YAML_DEPTH:
                raise SpecError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)


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


def read_json(path: str | Path) -> object:
    """One JSON document (a profile), within the bounds of :func:`read_yaml`."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
        if len(raw) > MAX_YAML_BYTES:
            raise SpecError(f"{path}: larger than {MAX_YAML_BYTES >> 20} MiB")
        data = json.loads(raw)
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from exc
    except RecursionError:
        raise SpecError(f"{path}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    _check_shape(data, str(path))
    return data
