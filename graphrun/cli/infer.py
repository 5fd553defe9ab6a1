"""``graphrun infer serve|embed``: answers from a trained job over its running store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from graphrun.arguments import add_fields, from_fields, is_loopback_host
from graphrun.serving.protocol import Bounds

DESCRIPTION = """\
serve: an Open Inference Protocol (KServe v2 REST) endpoint for a trained job's model;
each request's neighbourhood is sampled from the running store (graphrun serve) and its
features pulled as the trainers pull them. embed: every node's embeddings, logits and
predictions into the store (layer-wise, full neighbourhoods), for `mode: precomputed`;
on a live graph --live keeps every layer's states and --refresh then recomputes only the
nodes whose in-neighbourhood changed since.

Both join the store with a job key (it cannot write the graph): graphrun keygen
JOB.key --store STORE.key --clients clients/. See docs/serving.md.

Examples:
  graphrun infer serve job.yaml --store tcp://127.0.0.1:7000 --store tcp://127.0.0.1:7001 \\
      --key-file small.key --port 8080
  graphrun infer serve job.yaml --host 0.0.0.0 --token-file token.txt   # store from the job
  graphrun infer embed job.yaml --store ... --key-file small.key
  graphrun infer embed job.yaml --live ...      # then, after writes: --refresh
  graphrun infer embed job.yaml --live --follow ...   # and refresh as the head moves
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", type=Path, help="the job's GraphJob file (model, fanouts, feature)")
    p.add_argument(
        "--store",
        action="append",
        metavar="ADDR",
        help="the main server of every partition, in partition order (tcp://host:port; "
        "default: the job's spec.graph.store.addresses)",
    )
    p.add_argument(
        "--key-file",
        type=Path,
        help="a job key of the store (default: the job's spec.graph.store.keyFile)",
    )
    p.add_argument(
        "--checkpoint", type=Path, help="directory of checkpoint.pt (default: the job's)"
    )
    p.add_argument("--store-timeout", type=float, default=5.0, help="seconds a store request waits")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "infer",
        help="answer from a trained job: an inference endpoint, whole-graph embeddings",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="infer", metavar="WHAT", required=True)
    s = sub.add_parser("serve", help="the Open Inference Protocol endpoint (HTTP)")
    _common(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback)")
    s.add_argument("--port", type=int, default=8080, help="port (0: any free one)")
    s.add_argument("--token-file", type=Path, help="bearer token; required off loopback")
    s.add_argument("--model-name", help="the model's name in the routes (default: the job's)")
    s.add_argument("--mode", choices=("sampled", "full"), default="sampled",
                   help="default mode of a request (sampled: the job's fanouts)")  # fmt: skip
    s.add_argument("--seed", type=int, help="default sampling seed (default: training.seed)")
    add_fields(s, Bounds)  # --max-body-bytes, --max-ids, ... as Bounds declares them
    s.add_argument("--window-ms", type=float, default=2.0, help="micro-batch gathering window")
    s.add_argument("--probe-s", type=float, default=1.0, help="store probe period")
    s.add_argument("--follow", choices=("head", "pinned"),
                   help="a live graph: sample the head of each forward, or the head (or "
                   "--version) when joining (default: the base graph)")  # fmt: skip
    s.add_argument("--version", type=int, help="with --follow pinned: the version to read")
    s.add_argument("--ready-file", type=Path, help='write {"url": ...} here once listening')
    s.set_defaults(func=serve)
    e = sub.add_parser("embed", help="every node's embeddings and predictions into the store")
    _common(e)
    e.add_argument("--batch-size", type=int, default=4096, help="targets per layer-wise batch")
    how = e.add_mutually_exclusive_group()
    how.add_argument("--live", action="store_true",
                     help="a live graph: the pass at the head (or --version), every layer's "
                     "states kept for --refresh")  # fmt: skip
    how.add_argument("--refresh", action="store_true",
                     help="recompute only the nodes whose in-neighbourhood changed since the "
                     "kept states' version, up to the head (or --version)")  # fmt: skip
    e.add_argument("--version", type=int, help="the live graph's version (default: the head)")
    e.add_argument("--follow", action="store_true",
                   help="with --live or --refresh: stay up and refresh each time the head "
                   "moves (one JSON line a pass; SIGTERM or Ctrl-C stops it)")  # fmt: skip
    e.add_argument("--poll-s", type=float, default=1.0, help="with --follow: head poll period")
    e.set_defaults(func=embed)


def _check(args: argparse.Namespace) -> None:
    from graphrun.errors import ArgumentError

    bounds = {
        "--store-timeout": (args.store_timeout, 0.1, 600), "--threads": (args.threads, 1, 1024),
    }  # fmt: skip
    if args.func is serve:
        bounds |= {
            "--max-body-bytes": (args.max_body_bytes, 256, 1 << 28),
            "--max-ids": (args.max_ids, 1, 1 << 20),
            "--max-neighbors": (args.max_neighbors, 1, 1 << 20),
            "--max-batch-ids": (args.max_batch_ids, 1, 1 << 22),
            "--max-queue": (args.max_queue, 1, 1 << 16),
            "--window-ms": (args.window_ms, 0, 1000),
            "--probe-s": (args.probe_s, 0.05, 3600),
            "--seed": (args.seed if args.seed is not None else 0, 0, 2**62 - 1),
        }
        if args.version is not None:
            if args.follow != "pinned":
                raise ArgumentError("--version: only with --follow pinned")
            bounds["--version"] = (args.version, 0, 2**62)
    else:
        bounds["--batch-size"] = (args.batch_size, 1, 1 << 24)
        if args.version is not None:
            if not (args.live or args.refresh):
                raise ArgumentError("--version: only with --live or --refresh")
            if args.follow:
                raise ArgumentError("--version: not with --follow (it follows the head)")
            bounds["--version"] = (args.version, 0, 2**62)
        if args.follow and not (args.live or args.refresh):
            raise ArgumentError("--follow: only with --live or --refresh")
        bounds["--poll-s"] = (args.poll_s, 0.01, 3600)
    for flag, (v, lo, hi) in bounds.items():
        if not lo <= v <= hi:
            raise ArgumentError(f"{flag}: {v} is not in [{lo}, {hi}]")
    if args.func is serve and args.max_ids > args.max_batch_ids:
        raise ArgumentError(
            f"--max-ids: {args.max_ids} is more than --max-batch-ids {args.max_batch_ids} "
            f"(a request is answered in one forward)"
        )


def serve(args: argparse.Namespace) -> int:
    from graphrun.errors import ArgumentError
    from graphrun.serving import config

    _check(args)
    token = config.read_token(args.token_file) if args.token_file is not None else None
    if token is None and not is_loopback_host(args.host):
        raise ArgumentError(
            f"--host: {args.host} is not loopback; give --token-file (clients send "
            f"Authorization: Bearer <token>)"
        )
    if args.model_name is not None and not config.MODEL_NAME.match(args.model_name):
        raise ArgumentError(f"--model-name: {args.model_name!r} is not [A-Za-z0-9_.-]+")
    t = config.target(args.job, args.store, args.key_file, args.checkpoint)
    sock = config.bind(args.host, args.port)
    try:
        return _serve(args, t, token, sock)
    finally:
        sock.close()


def _serve(args: argparse.Namespace, t: Any, token: str | None, sock: Any) -> int:
    import torch
    import uvicorn

    from graphrun.files import write_atomic
    from graphrun.machine.readiness import store_is_ready
    from graphrun.names import Endpoint
    from graphrun.serving.app import Server, Settings, build_app
    from graphrun.serving.engine import Engine

    torch.set_num_threads(args.threads)
    engine = Engine(t.spec, t.checkpoint, t.servers, t.keys, t.job_name, args.store_timeout,
                    follow=args.follow, version=args.version)  # fmt: skip
    is_ready = store_is_ready(t.key_file, timeout=min(1.0, args.store_timeout))
    endpoints = [Endpoint.parse(s.removeprefix("tcp://")) for s in t.servers]
    bounds = from_fields(Bounds, args)
    name = args.model_name or t.job.name
    settings = Settings(
        name, bounds, args.window_ms / 1000, args.probe_s, token, args.mode,
        t.spec.seed if args.seed is None else args.seed,
    )  # fmt: skip
    server = Server(engine, settings, lambda: all(is_ready(e) for e in endpoints))
    host, port = sock.getsockname()[:2]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    # h11, not uvicorn's "auto": with httptools installed (uvicorn[standard]) auto takes it,
    # and it keeps every header a stranger sends (50 MB of them in one request, measured);
    # h11 refuses a head past 16 KiB with 400. The loop is uvicorn's "auto": uvloop (a
    # dependency; asyncio's where it is missing), about 15% less of the endpoint's CPU a
    # precomputed request (benchmarks/README.md, "Issue 43, serve43d")
    cfg = uvicorn.Config(
        build_app(server), log_level="warning", access_log=False, lifespan="on",
        limit_concurrency=args.max_queue + 64, timeout_keep_alive=30, http="h11", loop="auto",
    )  # fmt: skip
    print(f"graphrun infer serve: model {name!r} at {url}/v2/models/{name} "
          f"({len(t.servers)} store partitions, job {t.job_name!r})", flush=True)  # fmt: skip
    if args.ready_file is not None:
        write_atomic(args.ready_file, json.dumps({"url": url, "model": name}))
    uvicorn.Server(cfg).run(sockets=[sock])
    return 0


def embed(args: argparse.Namespace) -> int:
    from graphrun.serving import config

    _check(args)
    t = config.target(args.job, args.store, args.key_file, args.checkpoint)
    if args.follow:
        return _follow(args, t)
    from graphrun.serving.engine import embed_job  # torch: after the arguments are checked

    how: Literal["live", "refresh"] | None = (
        "live" if args.live else "refresh" if args.refresh else None
    )
    out = embed_job(t, threads=args.threads, timeout=args.store_timeout,
                    batch_size=args.batch_size, how=how, version=args.version)  # fmt: skip
    print(json.dumps(out), flush=True)
    return 0


def _follow(args: argparse.Namespace, t: Any) -> int:
    """``--follow``: refresh as the head moves until SIGTERM or SIGINT (exit 0)."""
    import signal
    import threading

    from graphrun.serving.engine import job_pass
    from graphrun.serving.follow import follow
    from graphrun.signals import stop_on_signals

    stop = threading.Event()
    old = stop_on_signals(stop)

    def report(out: dict[str, Any]) -> None:
        print(json.dumps({"job": t.job_name, **out}), flush=True)

    try:
        with job_pass(t, threads=args.threads, timeout=args.store_timeout,
                      batch_size=args.batch_size) as what:  # fmt: skip
            follow(*what, live=args.live, poll_s=args.poll_s, stop=stop, report=report)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 0
