"""``graphrun render``: the Kubernetes objects the operator makes for a GraphJob, without a
cluster (as ``helm template`` does)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from graphrun.cli.operator import add_config_arguments, operator_config

DESCRIPTION = """\
Print every Kubernetes object the operator would make for JOB — the key Secret (its
shape: the keys are made at creation), the ConfigMap, the headless Service, the
NetworkPolicy, the gang scheduler's PodGroup or Workload, the partitioner Job, the
rendezvous pod of an elastic job, one worker pod per machine and the launcher pod — as
YAML documents separated by `---`, with no cluster. The job is checked as the operator
checks it: a spec it would refuse is one line naming the field.

The flags that shape the objects are the operator's (--image, --cluster-domain,
--gpus-per-node): give those of your deployment. Owner references carry a placeholder
uid (the GraphJob's is known once it is created).
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "render",
        help="print the Kubernetes objects the operator makes for a GraphJob (no cluster)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job", metavar="JOB.yaml", help="the GraphJob file")
    p.add_argument(
        "-o", "--output", metavar="DIR",
        help="write one file per object into DIR (new or empty) instead of printing them",
    )  # fmt: skip
    p.add_argument(
        "-n", "--namespace",
        help="the job's namespace (default: metadata.namespace of JOB, else 'default')",
    )  # fmt: skip
    add_config_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError, SpecError
    from graphrun.files import atomic_dir, dir_is_free
    from graphrun.job.gpus import split_document
    from graphrun.job.spec import parse_job
    from graphrun.job.spec.base import NAME_PATTERN
    from graphrun.operator.builders import check_supported
    from graphrun.operator.render import render, to_yaml
    from graphrun.placement._io import read_yaml

    config = operator_config(args)
    if args.namespace is not None and not _is_name(args.namespace, NAME_PATTERN):
        raise ArgumentError(f"--namespace: {args.namespace!r} is not a Kubernetes namespace name")
    if args.output is not None and (not args.output or not dir_is_free(args.output)):
        raise ArgumentError(f"-o: {args.output!r} must be a new or empty directory")
    doc = split_document(read_yaml(args.job, "job spec"), config.gpus_per_node)
    job = parse_job(doc, source=args.job)
    try:
        check_supported(job)
    except SpecError as exc:
        raise SpecError(f"{args.job}: {exc}") from None
    written = job.metadata.namespace
    if args.namespace and written and args.namespace != written:
        raise ArgumentError(f"--namespace: {args.namespace}, but {args.job} says {written}")
    objects = render(job, args.namespace or written or "default", config)
    texts = [to_yaml(o) for o in objects]
    if args.output is None:
        sys.stdout.write("---\n".join(texts))
        return 0
    with atomic_dir(args.output, ArgumentError) as out:
        for i, (obj, text) in enumerate(zip(objects, texts, strict=True)):
            name = f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
            (out / name).write_text(text)
    print(f"render: {len(objects)} objects written to {Path(args.output)}", file=sys.stderr)
    return 0


def _is_name(name: str, pattern: str) -> bool:
    return len(name) <= 63 and re.fullmatch(pattern, name) is not None
