"""Wire and file types, declared once: a msgspec ``Struct``'s fields are its format.

A type that crosses a socket (a store's ``join`` reply, a tensor's description) or
lies in a file (the hosts file, a launch plan, a profile, metrics lines) is a
``msgspec.Struct``. :func:`to_builtins` turns one into dicts, lists and scalars (for
the msgpack codec or ``json.dumps``: every field, in declaration order, so a file's
bytes stay what a hand-written ``to_dict`` wrote); :func:`convert` checks builtins
against the declaration and builds the value, nested types included. Every problem is
one error line naming the source and the field::

    hosts.json: machines[0].address: Expected `str`, got `int`

``__post_init__`` checks what a type cannot say (a dtype on the allow-list, a
non-negative count) with ``ValueError``, and the message lands in the same line.
The only conversions beyond msgspec's own: a ``Path``, a
:class:`~graphrun.names.RoleName` and an :class:`~graphrun.names.Endpoint` are strings,
and integer keys of a JSON object are the strings of those integers (``str_keys``). A
``RoleName`` as a dict key is read by :func:`decoder` (JSON text) or
:func:`convert_json`, not by :func:`convert`.

A file of graphrun's own begins with ``"format"`` (what it is) and ``"version"`` (of
its layout). :func:`check_header` is the one check of the two, before any other field
is looked at, so a file of another kind or version is refused as such::

    parts/partition.json: field 'version' is 2; this graphrun reads version 1

:func:`read_file` is the one reader of such a file: a JSON object, its header, then its
declared fields.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import msgspec

from graphrun.errors import GraphrunError, SpecError, UserError
from graphrun.files import read_json, write_atomic
from graphrun.names import Endpoint, RoleName

T = TypeVar("T")


_TEXT = (Path, RoleName, Endpoint)  # the types written as their text


def _enc(value: object) -> str:
    if isinstance(value, _TEXT):
        return str(value)
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def dec_hook(type_: type, value: object) -> Path | RoleName | Endpoint:
    """msgspec's ``dec_hook``: a ``Path``, a ``RoleName`` or an ``Endpoint`` from its
    text."""
    if type_ is Path and isinstance(value, str):
        return Path(value)
    if type_ is RoleName or type_ is Endpoint:
        if not isinstance(value, str):
            raise ValueError(f"Expected `str`, got `{type(value).__name__}`")
        return type_.parse(value)  # a ValueError: msgspec adds where, a key or a field
    raise NotImplementedError


def schema_hook(type_: type) -> dict[str, object]:
    """msgspec's ``schema_hook``: a ``Path``, a ``RoleName`` or an ``Endpoint`` is a
    string in a JSON Schema (a CRD's), as on the wire."""
    if type_ in _TEXT:
        return {"type": "string"}
    raise NotImplementedError


def decoder(type_: type[T]) -> msgspec.json.Decoder[T]:
    """A JSON decoder of ``type_`` that reads a ``Path``, a ``RoleName`` or an
    ``Endpoint`` (a field or a dict key) from its text."""
    return msgspec.json.Decoder(type_, dec_hook=dec_hook)


def convert_json(
    type_: type[T], data: Any, where: str, error: type[GraphrunError] = SpecError
) -> T:
    """:func:`convert` for decoded JSON whose ``type_`` keys a dict by ``RoleName``:
    ``msgspec.convert`` hands a key to no ``dec_hook`` (a key would stay text), so
    ``data`` goes back through JSON text and :func:`decoder`."""
    try:
        return decoder(type_).decode(msgspec.json.encode(data))
    except msgspec.ValidationError as exc:
        raise error(f"{where}: {describe(exc)}") from None


@overload
def to_builtins(value: msgspec.Struct) -> dict[str, Any]: ...
@overload
def to_builtins(value: object) -> object: ...
def to_builtins(value: object) -> object:
    """``value`` (a Struct, or containers of them) as dicts, lists and scalars."""
    return msgspec.to_builtins(value, enc_hook=_enc)


def write_json(path: str | Path, value: Any, indent: int | None = 2) -> Path:
    """``value`` as a JSON file (indented, a newline at the end), written atomically."""
    return write_atomic(Path(path), json.dumps(to_builtins(value), indent=indent) + "\n")


def convert(type_: type[T], data: Any, where: str, error: type[GraphrunError] = SpecError) -> T:
    """``data`` (decoded JSON, YAML or msgpack) as a ``type_``; ``error`` with one line
    naming ``where`` and the field when it is not one."""
    try:
        return msgspec.convert(data, type_, str_keys=True, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise error(f"{where}: {describe(exc)}") from None


_MISSING = "Object missing required field `"


def describe(exc: msgspec.ValidationError) -> str:
    """``field: problem`` from msgspec's ``problem - at `$.field` ``; a missing field
    is ``field: missing``."""
    msg, _, at = str(exc).partition(" - at `")
    field = at.rstrip("`").removeprefix("key` in `").removeprefix("$").removeprefix(".")
    if msg.startswith(_MISSING):
        name = msg.removeprefix(_MISSING).rstrip("`")
        field, msg = (f"{field}.{name}" if field else name), "missing"
    return f"{field}: {msg}" if field else msg


class Header(msgspec.Struct):
    """The first two fields of every file graphrun writes for itself."""

    format: str
    version: int


def check_header(
    data: Any,
    where: str,
    fmt: str | None,
    version: int | tuple[int, ...],
    error: type[GraphrunError] = SpecError,
) -> Header:
    """The header of ``data`` (a decoded JSON object, or the dict of a ``torch.save``
    file), which must be ``fmt`` (``None``: a file with no ``format`` field, such as
    ``store.json``) at ``version`` (or one of several a reader still reads); otherwise
    ``error``, one line naming ``where`` and the field."""
    if not isinstance(data, dict):
        raise error(f"{where}: expected a JSON object")
    got = data.get("format")
    if fmt is not None and got != fmt:
        raise error(f"{where}: field 'format' is {got!r}, not {fmt!r}")
    versions = version if isinstance(version, tuple) else (version,)
    have = data.get("version")
    if isinstance(have, bool) or have not in versions:
        readable = " or ".join(str(v) for v in versions)
        raise error(f"{where}: field 'version' is {have!r}; this graphrun reads version {readable}")
    return Header(format=fmt or "", version=have)


KEY_FORMAT = "graphrun-key"
KEY_VERSION = 1


class KeyFile(Header, kw_only=True):
    """A key file: a job's CURVE key pair (Z85, 40 characters each; ``server``: the
    public key of the store it opens when that is not its own), or a public key alone
    (a store's ``--clients`` entry). Declared here, at the bottom, because two layers
    write it: :mod:`graphrun.rpc.auth` and the operator's Secret, which has no zmq."""

    public: str
    secret: str | msgspec.UnsetType = msgspec.UNSET
    server: str | msgspec.UnsetType = msgspec.UNSET
    grants: list[str] | msgspec.UnsetType = msgspec.UNSET  # a --clients entry's (access.py)


def key_file_text(
    public: str, secret: str | None = None, server: str | None = None, grants: Sequence[str] = ()
) -> str:
    """The key file's content: one JSON line, fields in declaration order."""
    unset = msgspec.UNSET
    keys = KeyFile(
        KEY_FORMAT,
        KEY_VERSION,
        public=public,
        secret=unset if secret is None else secret,
        server=unset if server is None else server,
        grants=list(grants) if grants else unset,
    )
    return json.dumps(to_builtins(keys)) + "\n"


def read_file(
    type_: type[T],
    path: str | Path,
    what: str,
    fmt: str | None,
    version: int,
    error: type[UserError] = SpecError,
) -> T:
    """The ``type_`` in the JSON file ``path`` (``what`` names it in errors: "partition
    config"): read, its header checked (:func:`check_header`), its fields converted
    (:func:`convert`); every problem is one ``error`` line naming the file."""
    data = read_json(Path(path), what, error)
    check_header(data, str(path), fmt, version, error)
    return convert(type_, data, str(path), error)
