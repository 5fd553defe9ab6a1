"""Argument types shared by the ``graphrun`` commands and benchmarks: every number with
its bounds and every output path checked while the command line is parsed, before any
work starts (``ps --profile no/dir/x`` failed only at stop, ``plan --timeline`` only
after the search, ``rendezvous --max-value 1e20`` deep in ZeroMQ).

A ``type=`` function here raises :class:`argparse.ArgumentTypeError`; argparse names the
flag, and :class:`OneLineParser` prints it as the CLI prints a
:class:`graphrun.errors.UserError`: one line, exit 2. No heavy imports: ``graphrun
--help`` builds every parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from graphrun.errors import ArgumentError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    D = TypeVar("D", bound=DataclassInstance)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``graphrun: error: argument --x:
    ...``, exit 2) rather than the usage and the error; its subparsers are too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"graphrun: error: {message} (`{self.prog} --help` lists the arguments)\n")


def add_fields(
    parser: argparse.ArgumentParser,
    model: type[DataclassInstance],
    only: Collection[str] | None = None,
    defaults: Mapping[str, object] | None = None,
) -> None:
    """One flag per field of the dataclass ``model`` (``feat_dim``: ``--feat-dim``), typed
    by its default and helped by its ``metadata["help"]``, so that a command restates
    none of them; ``only`` picks fields, ``defaults`` changes some defaults. The model
    checks the values (:func:`from_fields` builds it). A field's help ends with its
    default (``metadata["shown"]``: how to say it) unless ``metadata["quiet"]``;
    ``metadata["choices"]``: the values the flag takes."""
    for f in dataclasses.fields(model):
        if only is not None and f.name not in only:
            continue
        default = (defaults or {}).get(f.name, f.default)
        help_ = f.metadata.get("help")
        if help_ is not None and not f.metadata.get("quiet"):
            shown = f.metadata.get("shown")
            help_ += f" (default: {shown})" if shown else f" (default {_shown(default)})"
        flag = "--" + f.name.replace("_", "-")
        choices = f.metadata.get("choices")  # of the default's type
        parser.add_argument(flag, type=type(default), default=default, choices=choices, help=help_)


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def from_fields(model: type[D], args: argparse.Namespace) -> D:
    """The ``model`` of the flags :func:`add_fields` added (the other fields default)."""
    names = {f.name for f in dataclasses.fields(model)}
    return model(**{k: v for k, v in vars(args).items() if k in names})


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """A whole number in ``[lo, hi]`` (``1e30`` is not one)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is not in [{lo}, {hi}]")
        return value

    return parse


def number(lo: float, hi: float, *, above: bool = False) -> Callable[[str], float]:
    """A finite number in ``[lo, hi]``, or ``(lo, hi]`` with ``above`` (NaN is none)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value > lo if above else value >= lo
        if not (low_ok and value <= hi and math.isfinite(value)):
            raise argparse.ArgumentTypeError(
                f"{text} is not in {'(' if above else '['}{lo:g}, {hi:g}]"
            )
        return value

    return parse


def integers(lo: int, hi: int, most: int) -> Callable[[str], list[int]]:
    """Comma-separated whole numbers (``25,10``), each in ``[lo, hi]``, one to ``most``."""
    one = integer(lo, hi)

    def parse(text: str) -> list[int]:
        items = [t for t in text.split(",") if t.strip()]
        if not 1 <= len(items) <= most:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give 1 to {most} comma-separated whole numbers"
            )
        return [one(t.strip()) for t in items]

    return parse


def store_address(text: str) -> str:
    """A store server's address (:func:`graphrun.names.store_address`: ``host:port`` or
    ``tcp://host:port``), as ``tcp://host:port``."""
    from graphrun import names  # numpy: not at `graphrun --help`

    try:
        return names.store_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_file(text: str) -> Path:
    """A file to write: it names a file (not ``""``, not a directory) in a directory that
    exists and can be written, and is not an existing file that cannot be."""
    path = Path(text)
    if not text or text.endswith("/") or path.name in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} names no file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name the file to write")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text}: cannot write there (permission denied)")
    return path


def output_dir(text: str) -> Path:
    """A directory to write into: an existing one that can be written, or one that can
    be made (its nearest existing ancestor is a writable directory)."""
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("'' names no directory")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    have = path
    while not have.exists():
        have = have.parent
    if not have.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {have} is not a directory")
    if not os.access(have, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {have} (permission denied)")
    return path


def is_loopback(address: str) -> bool:
    """Whether a ZeroMQ address can only be reached from this host: ``ipc://``,
    ``inproc://``, or TCP on a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``).
    ``*``, ``0.0.0.0``, an interface or a host name are not."""
    scheme, _, rest = address.partition("://")
    return scheme in ("ipc", "inproc") or is_loopback_host(rest.rsplit(":", 1)[0])


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name, or an IP address, IPv6 bracketed or not) is this host
    only: an address in ``127.0.0.0/8``, ``::1``, or ``localhost``."""
    host = host.removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_plaintext_flags(p: argparse.ArgumentParser) -> None:
    """A server's ``--insecure`` and ``--insecure-non-loopback`` (checked by
    :func:`check_plaintext_address`)."""
    p.add_argument(
        "--insecure", action="store_true",
        help="no key: plaintext, unauthenticated (tests; a loopback --address only)",
    )  # fmt: skip
    p.add_argument(
        "--insecure-non-loopback", action="store_true",
        help="with --insecure: serve plaintext on a non-loopback --address too, to anyone "
        "who reaches it (SECURITY.md)",
    )  # fmt: skip


def check_plaintext_address(flag: str, address: str, insecure: bool, anywhere: bool) -> None:
    """``--insecure`` serves plaintext to whoever reaches the port: on a loopback address
    only, unless ``--insecure-non-loopback`` asks for it by name (it was served on every
    interface without a word)."""
    if anywhere and not insecure:
        raise ArgumentError("--insecure-non-loopback: only with --insecure")
    if insecure and not anywhere and not is_loopback(address):
        raise ArgumentError(
            f"{flag}: {address!r} is not a loopback address, and --insecure serves "
            "unauthenticated plaintext to anyone who reaches it; give a key, bind "
            "127.0.0.1, or add --insecure-non-loopback"
        )
