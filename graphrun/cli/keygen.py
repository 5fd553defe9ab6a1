"""``graphrun keygen PATH``: a new job key file (a store's key, to share with its jobs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "keygen",
        help="write a new key file (mode 0600) for a store and the jobs that use it",
        description="Write a new CURVE key pair to PATH (mode 0600; an existing file is "
        "kept and refused). `graphrun serve --key-file PATH` serves with it; jobs name it "
        "in spec.graph.store.keyFile, or as the Secret of keySecret on Kubernetes:\n"
        "  kubectl create secret generic NAME --from-file=job.key=PATH",
    )
    p.add_argument("path", help="the key file to write")
    p.add_argument(
        "--store",
        metavar="STORE_KEY",
        help="a job key for the shared store whose key file this is: it records the "
        "store's public key (put the new file in the store's --clients dir as JOB.key)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError
    from graphrun.files import write_atomic
    from graphrun.rpc.auth import KeyPair, key_file_text, load_keys, new_keypair

    args.path, args.store = _key_path("PATH", args.path), _key_path("--store", args.store)
    if args.path.is_dir():
        raise ArgumentError(f"PATH: {args.path} is a directory; name the key file to write")
    if not args.path.parent.is_dir():
        raise ArgumentError(f"{args.path}: directory {args.path.parent} does not exist")
    keys = new_keypair()
    if args.store is not None:
        keys = KeyPair(keys.public, keys.secret, server=load_keys(args.store).public)
    try:
        write_atomic(args.path, key_file_text(keys), mode=0o600, replace=False)
    except FileExistsError:
        raise ArgumentError(f"{args.path}: already exists (a key is never overwritten)") from None
    print(f"graphrun keygen: wrote {args.path}")
    return 0


def _key_path(flag: str, text: str | None) -> Path | None:
    """``text`` as a path, refused when it names no file (empty, or ends in ``/``)."""
    from graphrun.errors import ArgumentError

    if text is None:
        return None
    path = Path(text)
    if not text.strip() or text.endswith("/") or path.name in ("", ".", ".."):
        raise ArgumentError(f"{flag}: {text!r} names no file; give the key file's path")
    return path
