"""``graphrun keygen PATH``: a new key file (a store's admin key, or a job key of a shared
store, whose public half goes in the store's ``--clients`` directory)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Write a new CURVE key pair to PATH (mode 0600; an existing file is kept and refused).

A store's admin key:
  graphrun keygen store.key
  graphrun serve parts/ --part 0 --key-file store.key
A job key of a shared store (the secret stays with the job, the store gets the public key;
the file's name is the job's, metadata.name of its GraphJob; clients/ is made, mode 0700):
  graphrun keygen job-a.key --store store.key --clients clients/
  graphrun serve parts/ --part 0 --key-file store.key --clients clients/
  # the job names job-a.key in spec.graph.store.keyFile, or on Kubernetes:
  kubectl create secret generic job-a-key --from-file=job.key=job-a.key
Remove clients/job-a.key to revoke it (the store refuses the key within a second).
A writer's key of a live store (it may write the graph; a job key may not):
  graphrun keygen writer.key --store store.key --clients clients/ --grants write_graph
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "keygen",
        help="write a new key file (mode 0600) for a store or a job of a shared store",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="the key file to write (its name's stem: the job)")
    p.add_argument(
        "--store",
        metavar="STORE_KEY",
        help="make a job key for the shared store whose key file this is (it records the "
        "store's public key)",
    )
    p.add_argument(
        "--clients",
        type=Path,
        metavar="DIR",
        help="with --store: also write the public key to DIR/<job>.key, the store's "
        "--clients directory (the store needs no secret; DIR is made, mode 0700)",
    )
    p.add_argument(
        "--grants",
        default="",
        metavar="GRANT[,GRANT]",
        help="with --clients: what the key may do beyond a job key (write_graph: write the "
        "live graph, docs/live.md)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError
    from graphrun.files import write_atomic
    from graphrun.rpc.auth import (
        KeyPair,
        key_file_text,
        load_keys,
        new_keypair,
        public_key_file_text,
    )

    args.path, args.store = _key_path("PATH", args.path), _key_path("--store", args.store)
    if args.path.is_dir():
        raise ArgumentError(f"PATH: {args.path} is a directory; name the key file to write")
    if not args.path.parent.is_dir():
        raise ArgumentError(f"{args.path}: directory {args.path.parent} does not exist")
    public_file = None
    grants = _grants(args.grants, args.clients is not None)
    if args.clients is not None:
        if args.store is None:
            raise ArgumentError("--clients: needs --store (the clients hold job keys)")
        _check_job_name(args.path)
        if args.clients.exists() and not args.clients.is_dir():
            raise ArgumentError(f"--clients: {args.clients} is not a directory")
        if not args.clients.parent.is_dir():
            raise ArgumentError(f"--clients: directory {args.clients.parent} does not exist")
        public_file = args.clients / f"{args.path.stem}.key"
        if public_file.resolve() == args.path.resolve():
            raise ArgumentError(
                f"{args.path}: the secret key goes outside --clients {args.clients}"
            )
        if public_file.exists():
            raise ArgumentError(f"{public_file}: already exists (a key is never overwritten)")
    keys = new_keypair()
    if args.store is not None:
        keys = KeyPair(keys.public, keys.secret, server=load_keys(args.store).public)
    if args.path.exists():
        raise ArgumentError(f"{args.path}: already exists (a key is never overwritten)")
    if args.clients is not None:
        args.clients.mkdir(mode=0o700, exist_ok=True)
    try:
        write_atomic(args.path, key_file_text(keys), mode=0o600, replace=False)
    except FileExistsError:
        raise ArgumentError(f"{args.path}: already exists (a key is never overwritten)") from None
    print(f"graphrun keygen: wrote {args.path}")
    if public_file is not None:
        try:
            text = public_key_file_text(keys.public, grants)
            write_atomic(public_file, text, mode=0o644, replace=False)
        except FileExistsError:
            args.path.unlink()  # no half-made job key
            raise ArgumentError(
                f"{public_file}: already exists (a key is never overwritten)"
            ) from None
        print(f"graphrun keygen: wrote {public_file} (public key: job {args.path.stem!r})")
    return 0


def _grants(text: str, clients: bool) -> list[str]:
    """The ``--grants`` list, each one known; refused without ``--clients``."""
    from graphrun.errors import ArgumentError
    from graphrun.rpc.access import GRANTS

    grants = [g.strip() for g in text.split(",") if g.strip()]
    if grants and not clients:
        raise ArgumentError("--grants: needs --clients (a grant is written to the store's entry)")
    for g in grants:
        if g not in GRANTS:
            raise ArgumentError(f"--grants: {g!r} is not one of {sorted(GRANTS)}")
    return grants


def _check_job_name(path: Path) -> None:
    """A job key's file is named after its job: refuse a name no GraphJob can have."""
    import re

    from graphrun.errors import ArgumentError
    from graphrun.job.spec.base import JOB_NAME_MAX, JOB_NAME_PATTERN

    job = path.stem
    if not re.match(JOB_NAME_PATTERN, job) or len(job) > JOB_NAME_MAX:
        raise ArgumentError(
            f"PATH: {path.name!r} names job {job!r}, which no job can be named (a job's "
            f"name: lower-case letters, digits and '-', a letter first and a letter or "
            f"digit last, at most {JOB_NAME_MAX} characters; e.g. job-a.key)"
        )


def _key_path(flag: str, text: str | None) -> Path | None:
    """``text`` as a path, refused when it names no file (empty, or ends in ``/``)."""
    from graphrun.errors import ArgumentError

    if text is None:
        return None
    path = Path(text)
    if not text.strip() or text.endswith("/") or path.name in ("", ".", ".."):
        raise ArgumentError(f"{flag}: {text!r} names no file; give the key file's path")
    return path
