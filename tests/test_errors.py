"""The one error tree: every public error class lives in graphrun/errors.py."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import graphrun
from graphrun import errors

ROOT = Path(graphrun.__file__).parent
EXCEPTIONS = {
    *(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)),
    *(n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)),
}


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def test_no_public_error_class_outside_the_error_tree() -> None:
    outside = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            if any(_base_name(b) in EXCEPTIONS for b in node.bases):
                outside.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert outside == []


def test_one_peer_lost_for_the_partitioner_and_the_probe() -> None:
    from graphrun.measure import member
    from graphrun.partition import comm

    assert member.PeerLost is comm.PeerLost is errors.PeerLost
    assert not issubclass(errors.PeerLost, errors.UserError)


def test_a_probe_without_the_key_is_a_host_error_and_a_lost_connection() -> None:
    with pytest.raises(OSError, match="no key"):  # the measuring loops catch OSError
        raise errors.ProbeAuthError("no key")
    assert issubclass(errors.ProbeAuthError, errors.HostError)


def test_the_docstring_draws_every_class_of_the_tree() -> None:
    doc = errors.__doc__ or ""
    for name, value in vars(errors).items():
        if isinstance(value, type) and issubclass(value, errors.GraphrunError):
            assert f"── {name} " in doc or name == "GraphrunError", name
