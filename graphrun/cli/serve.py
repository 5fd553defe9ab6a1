"""``graphrun serve PARTITION_DIR --part K``: run a long-lived store server for one partition."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from graphrun.arguments import add_plaintext_flags, integer, number, output_file, store_address
from graphrun.parent import graceful_with_parent, set_death_signal

DESCRIPTION = """\
Serve partition K of a partition directory until stopped (a `stop` request from a
client, SIGTERM or Ctrl-C: clean shutdown, shared memory removed). Clients of any
number of jobs join and leave at any time; a client silent for --heartbeat-timeout
seconds is dropped and its job's non-persistent tensors are freed.

With --backups N the main server also starts N backup servers on this machine that
serve the same shared memory (clients spread requests over them). A backup can also
be started by hand with --backup-of MAIN_ADDRESS --backup-index B.

Every message is authenticated and encrypted (CURVE): --key-file names the store's admin
key; without one, PARTITION_DIR/store.key is used, made (mode 0600) if missing, and its
path printed. The admin key can do everything, stop the store included. Jobs sharing the
store should get job keys of their own (`graphrun keygen JOB.key --store STORE.key
--clients clients/` writes the secret to JOB.key, for the job, and the public key to
clients/JOB.key; serve with --clients clients/): a job key reads the graph and its own
job's tensors only, and cannot write the graph, stop the store or register backups.
Removing clients/JOB.key revokes it within a second.
--insecure serves in plaintext, to anyone who can reach the port: for tests, on a loopback
address only (127.0.0.1, ::1, ipc://); another address is refused unless
--insecure-non-loopback asks for it by name.

Examples:
  graphrun serve parts/ --part 0 --address tcp://0.0.0.0:7000 --key-file store.key
  graphrun serve parts/ --part 0 --key-file store.key --clients clients/
  graphrun serve parts/ --part 0 --backups 1 --ready-file /tmp/store0.json
  graphrun serve parts/ --part 0 --features disk --disk-cache-mb 2048
  graphrun serve parts/ --part 0 --key-file store.key --live-dir /var/lib/graphrun
"""

#: extensions loaded when importable (the sampling layer registers its operations here)
DEFAULT_EXTENSIONS = ("graphrun.sampling.server:register",)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# what the flags may ask at most (a job's spec: 4096 partitions, 16 store servers per
# machine); --backups 100000 started processes until the host ran out
MAX_PART, MAX_BACKUPS, MAX_REPLICAS, MAX_RESTARTS, MAX_THREADS = 4095, 15, 16, 1000, 1024
MAX_HEARTBEAT_S = 86_400.0
MAX_DISK_CACHE_MB = float(1 << 30)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a graph partition (KV store server)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("partition_dir", type=Path, help="partition directory (partition.json)")
    p.add_argument(
        "--part", type=integer(0, MAX_PART), required=True, help="partition id K to serve"
    )
    p.add_argument(
        "--address",
        default="tcp://127.0.0.1:0",
        help="ZeroMQ address to bind (port 0: any free port; default %(default)s)",
    )
    p.add_argument("--advertise", help="host name/IP clients use (default: the bound host)")
    p.add_argument(
        "--key-file",
        type=Path,
        help="the store's admin key file (CURVE; default PARTITION_DIR/store.key)",
    )
    add_plaintext_flags(p)
    p.add_argument(
        "--clients",
        type=Path,
        metavar="DIR",
        help="job keys to admit besides the admin key: DIR/<job>.key, public keys "
        "(`graphrun keygen JOB.key --store STORE.key --clients DIR`); checked for changes "
        "every 0.2 s, so removing a file revokes its key. A job key acts only as its job: "
        "its own tensors and the graph (read-only), never stop or backups",
    )
    p.add_argument(
        "--backups", type=integer(0, MAX_BACKUPS), default=0,
        help=f"backup servers to start (default 0, at most {MAX_BACKUPS})",
    )  # fmt: skip
    p.add_argument(
        "--backup-restarts",
        type=integer(0, MAX_RESTARTS),
        default=3,
        help="restart a backup this server started that died, at most N times each "
        "(default 3); a dead backup is unregistered at once either way",
    )
    p.add_argument("--backup-of", metavar="MAIN_ADDRESS", help="run as a backup of this main")
    p.add_argument("--backup-index", type=integer(1, MAX_BACKUPS), default=1,
                   help="index of this backup (>= 1)")  # fmt: skip
    p.add_argument(
        "--replica-of",
        metavar="PRIMARY_ADDRESS",
        help="run as a replica of this partition's primary (usually on another machine): "
        "load the partition from the files, take the primary's writes",
    )
    p.add_argument("--replica-index", type=integer(1, MAX_REPLICAS), default=1,
                   help="index of this replica (>= 1)")  # fmt: skip
    p.add_argument("--shm-dir", type=Path, default=Path("/dev/shm"), help="shared-memory dir")
    p.add_argument(
        "--features",
        choices=("memory", "disk"),
        default="memory",
        help="where node features are served from: memory (copied into shared memory, the "
        "default) or disk (the partition's .npy files, memory-mapped read-only, with the "
        "hottest rows in a cache of --disk-cache-mb; for tables larger than the host's "
        "memory, docs/disk-features.md)",
    )
    p.add_argument(
        "--disk-cache-mb",
        type=number(0, MAX_DISK_CACHE_MB),
        default=0.0,
        help="with --features disk: MiB of node feature rows this server keeps in memory, "
        "those of the nodes with the most edges (default 0: every row read from the file)",
    )
    p.add_argument(
        "--live-dir",
        type=Path,
        metavar="DIR",
        help="keep the live graph's write-ahead log in DIR (an existing, writable directory "
        "on this machine's disk; DIR/part-K.wal): a write is acknowledged only once it is "
        "synced there, and a restarted server replays it (docs/live.md). Default: none, "
        "live writes are held in memory only and lost with the server",
    )
    p.add_argument(
        "--sequencer",
        action="append",
        type=store_address,
        metavar="ADDR",
        help="with --live-dir: where the live graph's sequencer (partition 0's primary, then "
        "its replicas, one flag each) serves now; a piece replayed pending asks its fate "
        "there, not at the address its log recorded (a restarted job's stores may have "
        "new addresses). Default: the logged address, until a writer names another",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=number(0, MAX_HEARTBEAT_S, above=True),
        default=30.0,
        help="drop silent clients (seconds)",
    )
    p.add_argument(
        "--extension",
        action="append",
        default=None,
        metavar="MODULE:FUNCTION",
        help="register extra request kinds (repeatable; default: sampling when installed)",
    )
    p.add_argument(
        "--threads",
        type=integer(1, MAX_THREADS),
        default=1,
        help="OpenMP threads (OMP_NUM_THREADS) for extensions that import torch (default 1:"
        " a server runs one request at a time)",
    )
    p.add_argument(
        "--ready-file",
        type=output_file,
        help="write {address, pid, part} JSON here when ready",
    )
    p.add_argument(
        "--profile",
        type=output_file,
        metavar="FILE",
        help="at stop, append the CPU seconds spent serving and the bytes sent (a JSON line "
        "`graphrun profile` reads, see graphrun.placement.profile)",
    )
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        help="logging level (default INFO)",
    )
    p.set_defaults(func=run)


def _default_extensions() -> list[str]:
    import importlib.util

    out = []
    for spec in DEFAULT_EXTENSIONS:
        mod = spec.partition(":")[0]
        try:
            if importlib.util.find_spec(mod) is not None:
                out.append(spec)
        except ModuleNotFoundError:
            pass
    return out


def _backup_cmd(args: argparse.Namespace, main_address: str, index: int) -> list[str]:
    host = main_address.rsplit(":", 1)[0]
    cmd = [sys.executable, "-m", "graphrun", "serve", str(args.partition_dir)]
    cmd += ["--part", str(args.part), "--address", f"{host}:0"]
    cmd += ["--backup-of", main_address, "--backup-index", str(index)]
    cmd += ["--shm-dir", str(args.shm_dir), "--heartbeat-timeout", str(args.heartbeat_timeout)]
    cmd += ["--log-level", args.log_level, "--threads", str(args.threads)]
    cmd += ["--features", args.features, "--disk-cache-mb", str(args.disk_cache_mb)]
    cmd += ["--key-file", str(args.key_file)] if args.key_file else ["--insecure"]
    cmd += ["--insecure-non-loopback"] if args.insecure_non_loopback else []
    if args.clients:
        cmd += ["--clients", str(args.clients)]
    for ext in args.extension or []:
        cmd += ["--extension", ext]
    return cmd


def _start_backup(cmd: list[str]) -> subprocess.Popen[bytes]:
    """A backup server, stopped (SIGTERM) if this server dies without stopping it."""
    return subprocess.Popen(cmd, preexec_fn=functools.partial(set_death_signal, signal.SIGTERM))


def _job_keys(args: argparse.Namespace) -> tuple[Any, Path | None]:
    """The key pair of ``--key-file``, else of ``PARTITION_DIR/store.key`` (made if missing,
    then also returned as the second value: remove it if the server never serves)."""
    from graphrun.errors import ArgumentError
    from graphrun.rpc.auth import ensure_keys, load_keys

    if args.key_file:
        return load_keys(args.key_file), None
    if args.backup_of or args.replica_of:
        raise ArgumentError("--key-file: a backup or replica needs its primary's key file")
    path = args.partition_dir / "store.key"
    keys, made = ensure_keys(path)
    args.key_file = path  # backups started by this server use it too
    print(f"graphrun serve: {'made' if made else 'using'} admin key {path} (clients need it)")
    return keys, path if made else None


def _check_args(args: argparse.Namespace) -> None:
    """Everything that can be checked before a key is made or a partition loaded."""
    from graphrun.arguments import check_plaintext_address
    from graphrun.errors import ArgumentError
    from graphrun.partition.format import load_partition_config
    from graphrun.rpc.addresses import check_address
    from graphrun.store.live_log import check_live_dir

    if args.key_file and args.insecure:
        raise ArgumentError("--insecure: cannot be given with --key-file")
    if args.replica_of and args.backup_of:
        raise ArgumentError("--replica-of: a replica is a main server, not a --backup-of")
    if args.clients is not None and not args.clients.is_dir():
        raise ArgumentError(f"--clients: {args.clients} is not a directory")
    if not args.shm_dir.is_dir():
        raise ArgumentError(f"--shm-dir: {args.shm_dir} is not a directory")
    if args.live_dir is not None:
        if args.backup_of:
            raise ArgumentError("--live-dir: a backup holds no live state (its main logs)")
        check_live_dir(args.live_dir, "--live-dir")
    if args.sequencer and args.live_dir is None:
        raise ArgumentError("--sequencer: only with --live-dir (a replayed log's pieces ask it)")
    if args.sequencer and len(args.sequencer) > 1 + MAX_REPLICAS:
        raise ArgumentError(f"--sequencer: at most {1 + MAX_REPLICAS} addresses (a primary "
                            f"and its replicas), got {len(args.sequencer)}")  # fmt: skip
    check_address(args.address)
    check_plaintext_address("--address", args.address, args.insecure, args.insecure_non_loopback)
    if not args.backup_of:
        num_parts = load_partition_config(args.partition_dir).get("num_parts")
        if isinstance(num_parts, int) and not 0 <= args.part < num_parts:
            raise ArgumentError(
                f"--part: {args.part} is not a partition of {args.partition_dir} "
                f"(0..{num_parts - 1})"
            )


def run(args: argparse.Namespace) -> int:
    from graphrun.files import write_atomic
    from graphrun.rpc.transport import Waker
    from graphrun.rpc.tuning import keep_large_allocations, small_pages_for_arrays
    from graphrun.store.server import ServerConfig, run_server

    keep_large_allocations()
    small_pages_for_arrays()  # the delta's merges: fresh MBs, zeroed in 2 MB pages else
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    _check_args(args)
    keys, made_key = (None, None) if args.insecure else _job_keys(args)
    cfg = ServerConfig(
        partition_dir=args.partition_dir,
        part=args.part,
        address=args.address,
        keys=keys,
        main_address=args.backup_of,
        backup_index=args.backup_index if args.backup_of else 0,
        replica_of=args.replica_of,
        replica_index=args.replica_index,
        advertise_host=args.advertise,
        shm_dir=args.shm_dir,
        heartbeat_timeout=args.heartbeat_timeout,
        extensions=tuple(args.extension if args.extension is not None else _default_extensions()),
        clients_dir=args.clients,
        profile_file=args.profile,
        features=args.features,
        disk_cache_bytes=int(args.disk_cache_mb * 2**20),
        live_dir=args.live_dir,
        sequencer=tuple(args.sequencer or ()),
    )
    # read by torch when an extension imports it (sampling's kernels are numpy and
    # single-threaded; importing torch here only to set its threads cost a second of CPU)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    stop = {"flag": False}
    waker = Waker()  # a signal ends the server's wait at once, not at its next tick

    def on_signal(signum: int, frame: Any) -> None:
        stop["flag"] = True
        waker.wake()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # started to die with a launcher (SIGKILL)? stop cleanly instead, unlinking the segments
    graceful_with_parent()
    children: list[subprocess.Popen[bytes]] = []
    restarts = [0] * args.backups
    main_address = {"": ""}

    def on_ready(address: str) -> None:
        main_address[""] = address
        made_key_box.clear()  # serving: the key it made is the store's from now on
        if not args.backup_of:
            for i in range(1, args.backups + 1):
                children.append(_start_backup(_backup_cmd(args, address, i)))
        if args.ready_file:
            info = {"address": address, "pid": os.getpid(), "part": args.part}
            data = {**info, "index": cfg.backup_index}
            write_atomic(args.ready_file, json.dumps(data) + "\n")
        print(f"graphrun serve: partition {args.part} ready on {address}", flush=True)

    def on_tick() -> None:  # the backups this server started: restart the dead, by policy
        for i, child in enumerate(children):
            code = child.poll()
            if code is None or stop["flag"] or restarts[i] < 0:
                continue
            if restarts[i] >= args.backup_restarts:
                logging.getLogger("graphrun.store").error(
                    "backup %d died (exit code %s); not restarted (--backup-restarts %d)",
                    i + 1, code, args.backup_restarts,
                )  # fmt: skip
                restarts[i] = -1
                continue
            restarts[i] += 1
            logging.getLogger("graphrun.store").warning(
                "backup %d died (exit code %s); restarting it (%d of %d)",
                i + 1, code, restarts[i], args.backup_restarts,
            )  # fmt: skip
            children[i] = _start_backup(_backup_cmd(args, main_address[""], i + 1))

    made_key_box = [made_key] if made_key is not None else []
    try:
        run_server(
            cfg, should_stop=lambda: stop["flag"], on_ready=on_ready, on_tick=on_tick,
            waker=waker,
        )  # fmt: skip
    except BaseException:
        for path in made_key_box:  # never served: leave no fresh key behind
            path.unlink(missing_ok=True)
        raise
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
    return 0
