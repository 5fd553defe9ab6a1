"""Bad input to the commands added last round (issue 40, item 3): refused while the
command line is parsed, before any work, in one line naming the flag, exit 2, no
traceback and nothing written. Each was a traceback, a failure only after the work
(``plan --timeline`` after the search, with the plan written; ``ps --profile`` at stop;
``run --profile FILE`` after the run directory was made) or accepted (``ps --index
10**30``, ``rendezvous --max-mb 10**15``, ``run --grace -5``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from graphrun import arguments, bench
from graphrun.cli import build_parser, main, serve
from graphrun.job.spec import base
from graphrun.job.spec.runtime import RuntimeSpec
from graphrun.rpc.auth import generate_keys

HUGE = str(10**30)
CLUSTER = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "Cluster",
    "machines": [
        {"name": f"m{i}", "cpu": 8, "memory_gb": 64, "gpus": 0, "bandwidth_gbps": 10}
        for i in range(2)
    ],
}
JOB = {
    "apiVersion": "graphrun.io/v1alpha1",
    "kind": "PlacementJob",
    "partitions": 2,
    "trainers": 2,
    "iterations": 2,
}
PLAN = ["plan", "{tmp}/c.yaml", "{tmp}/j.yaml", "-o", "{tmp}/p.yaml", "--steps", "5"]
RDV = ["rendezvous", "--bind", "tcp://127.0.0.1:0", "--key-file", "{tmp}/k.key"]
PS = ["ps", "--index", "0", "--key-file", "{tmp}/k.key"]
PS_PLAIN = ["ps", "--index", "0", "--insecure"]
ELASTIC = ["bench", "elastic", "--hosts", "local", "--dataset", "{tmp}"]
STEP = ["bench", "step", "--dataset", "{tmp}"]
TRAIN = ["bench", "train", "--dataset", "{tmp}"]
WORKER = ["worker", "--plan", "{tmp}/a-file"]
RUN = ["run", "{tmp}/a-file"]
SERVE = ["serve", "{tmp}/missing", "--part", "0", "--shm-dir", "{tmp}", "--insecure"]

CASES = [
    (
        [*PLAN, "--timeline", "{tmp}/no/t.png"],
        r"--timeline: .*/no/t\.png: .*/no is not a directory",
    ),
    ([*PLAN, "--timeline", ""], r"--timeline: '' names no file"),
    ([*PLAN, "--timeline", "{tmp}"], r"--timeline: .* is a directory"),
    ([*PLAN, "--timeline", "{tmp}/p.yaml"], r"--timeline: .*p\.yaml is also -o"),
    ([*PLAN, "--inline", "{tmp}/no/j.yaml"], r"--inline: .*/no is not a directory"),
    ([*PLAN[:3], "-o", "{tmp}/j.yaml"], r"-o: .*j\.yaml is also JOB"),
    (
        [*PLAN, "--timeline", "{tmp}/p.schedule.json"],
        r"--timeline: .* is also -o \(its schedules\)",
    ),
    ([*RDV, "--max-value", "1e20"], r"--max-value: '1e20' is not a whole number"),
    ([*RDV, "--max-value", str(10**20)], r"--max-value: 10{20} is not in \[1, "),
    ([*RDV, "--max-mb", str(10**15)], r"--max-mb: 10{15} is not in \[1, "),
    ([*RDV, "--max-keys", "0"], r"--max-keys: 0 is not in \[1, "),
    ([*RDV, "--max-key", str(1 << 40)], r"--max-key: \d+ is not in \[1, "),
    ([*PS, "--index", HUGE], r"--index: 10{30} is not in \[0, 63\]"),
    ([*PS, "--index", "1e30"], r"--index: '1e30' is not a whole number"),
    ([*PS, "--index", "-1"], r"--index: -1 is not in"),
    ([*PS, "--profile", "{tmp}/no/x"], r"--profile: .*/no/x: .*/no is not a directory"),
    ([*PS, "--profile", ""], r"--profile: '' names no file"),
    ([*PS, "--profile", "{tmp}"], r"--profile: .* is a directory"),
    ([*ELASTIC, "--fanouts", "a,b"], r"--fanouts: 'a' is not a whole number"),
    ([*ELASTIC, "--fanouts", ""], r"--fanouts: '': give 1 to 16"),
    ([*ELASTIC, "--fanouts", "10," + HUGE], r"--fanouts: 10{30} is not in \[-1, 100000\]"),
    ([*ELASTIC, "--epochs", str(10**9)], r"--epochs: 10{9} is not in \[2, "),
    ([*ELASTIC, "--hidden", str(10**11)], r"--hidden: 10{11} is not in \[1, 65536\]"),
    ([*ELASTIC, "--nodes", HUGE], r"--nodes: 10{30} is not in \[1000, "),
    ([*ELASTIC, "--workdir", "{tmp}/a-file"], r"--workdir: .* exists and is not a directory"),
    ([*ELASTIC, "--timeout-seconds", "nan"], r"--timeout-seconds: nan is not in \(0, 3600\]"),
    ([*STEP, "--fanouts", str(10**9)], r"--fanouts: 10{9} is not in \[0, 100000\]"),
    ([*STEP, "--batch-size", str(10**13)], r"--batch-size: 10{13} is not in \[1, "),
    ([*STEP, "--threads", "100000"], r"--threads: 100000 is not in \[1, 1024\]"),
    ([*TRAIN, "--fanouts", "10,x"], r"--fanouts: 'x' is not a whole number"),
    ([*TRAIN, "--epochs", "0"], r"--epochs: 0 is not in \[1, "),
    ([*TRAIN, "--hidden", str(10**11)], r"--hidden: 10{11} is not in \[1, 65536\]"),
    ([*TRAIN, "--feature-cache-mb", HUGE], r"--feature-cache-mb: 10{30} is not in \[0, "),
    ([*TRAIN, "--sampler-workers", "65"], r"--sampler-workers: 65 is not in \[0, 64\]"),
    ([*TRAIN, "--peer-timeout", "nan"], r"--peer-timeout: nan is not in"),
    ([*TRAIN, "--workdir", "{tmp}/a-file"], r"--workdir: .* exists and is not a directory"),
    ([*WORKER, "--grace", "-1"], r"--grace: -1 is not in \[0, 3600\]"),
    ([*WORKER, "--grace", "nan"], r"--grace: nan is not in"),
    ([*WORKER, "--stop-mark-wait", "1e300"], r"--stop-mark-wait: 1e300 is not in"),
    ([*WORKER, "--status-dir", "{tmp}/a-file"], r"--status-dir: .* is not a directory"),
    ([*RUN, "--grace", "-5"], r"--grace: -5 is not in \[0, 3600\]"),
    ([*RUN, "--grace", "inf"], r"--grace: inf is not in"),
    ([*RUN, "--bandwidth-mbit", "-1"], r"--bandwidth-mbit: -1 is not in \(0, "),
    ([*RUN, "--profile", "{tmp}/a-file"], r"--profile: .* exists and is not a directory"),
    ([*RUN, "--run-dir", "{tmp}/a-file"], r"--run-dir: .* exists and is not a directory"),
    ([*RUN, "--run-dir", ""], r"--run-dir: '' names no directory"),
    (["probe", "-o", ""], r"-o/--output: '' names no file"),
    (["probe", "-o", "{tmp}/no/c.yaml"], r"-o/--output: .*/no is not a directory"),
    (
        ["probe", "-o", "{tmp}/c.out", "--seconds", "1e300"],
        r"--seconds: 1e300 is not in \(0, 3600\]",
    ),
    (["probe", "-o", "{tmp}/c.out", "--timeout", "-1"], r"--timeout: -1 is not in \(0, "),
    ([*SERVE, "--backups", "100000"], r"--backups: 100000 is not in \[0, 15\]"),
    ([*SERVE, "--ready-file", ""], r"--ready-file: '' names no file"),
    ([*SERVE, "--profile", "{tmp}"], r"--profile: .* is a directory"),
    ([*SERVE, "--threads", "100000"], r"--threads: 100000 is not in \[1, 1024\]"),
    ([*SERVE, "--heartbeat-timeout", "1e300"], r"--heartbeat-timeout: 1e300 is not in \(0, "),
    ([*SERVE, "--part", HUGE], r"--part: 10{30} is not in \[0, 4095\]"),
    ([*SERVE, "--sequencer", "tcp://127.0.0.1:7000"], r"--sequencer: only with --live-dir"),
    ([*SERVE, "--sequencer", "nohost"], r"--sequencer: 'nohost' is not host:port"),
    (
        ["profile", "{tmp}/a-file", "-o", "{tmp}/no/p.json"],
        r"-o/--output: .*/no is not a directory",
    ),
    (["profile", "{tmp}/a-file", "-o", ""], r"-o/--output: '' names no file"),
    # item 6: plaintext on an address others reach only when asked for by name
    ([*SERVE, "--address", "tcp://0.0.0.0:0"], r"--address: .* not a loopback address"),
    ([*SERVE, "--address", "tcp://*:7000"], r"--address: .* not a loopback address"),
    ([*PS_PLAIN, "--address", "tcp://0.0.0.0:0"], r"--address: .* not a loopback address"),
    ([*PS_PLAIN, "--address", "tcp://10.1.2.3:0"], r"--address: .* not a loopback address"),
    ([*PS, "--insecure-non-loopback"], r"--insecure-non-loopback: only with --insecure"),
]


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CLUSTER))
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(JOB))
    (tmp_path / "a-file").write_text("")
    generate_keys(tmp_path / "k.key")
    return tmp_path


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


@pytest.mark.timeout(60)  # an argument taken starts a server or a search: fail, not hang
@pytest.mark.parametrize(("argv", "says"), CASES, ids=[" ".join(a[:2] + a[-2:]) for a, _ in CASES])
def test_refused_in_one_line_before_any_work(
    tmp: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    before = _files(tmp)
    code = main([a.replace("{tmp}", str(tmp)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("graphrun: error: ") and re.search(says, err), err
    assert _files(tmp) == before  # nothing written: no plan, no run directory, no key


def test_insecure_non_loopback_lifts_the_refusal_and_reaches_the_backups(
    tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asked for by name, the address passes (the missing partition directory is next)
    and the backups this server starts are asked the same way."""
    argv = [a.replace("{tmp}", str(tmp)) for a in SERVE]
    argv += ["--address", "tcp://0.0.0.0:0", "--insecure-non-loopback"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not a loopback address" not in err and "no such partition directory" in err, err
    args = build_parser().parse_args(argv)
    assert "--insecure-non-loopback" in serve._backup_cmd(args, "tcp://10.0.0.1:7000", 1)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("tcp://127.0.0.1:0", True),
        ("tcp://127.3.2.1:7000", True),
        ("tcp://localhost:7000", True),
        ("tcp://[::1]:7000", True),
        ("ipc:///tmp/x.sock", True),
        ("inproc://x", True),
        ("tcp://0.0.0.0:0", False),
        ("tcp://*:7000", False),
        ("tcp://[::]:7000", False),
        ("tcp://10.0.0.1:7000", False),
        ("tcp://eth0:7000", False),
        ("tcp://example.org:7000", False),
    ],
)
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert arguments.is_loopback(address) is loopback


def test_the_benchmarks_bounds_are_the_specs() -> None:
    assert (bench.MAX_EPOCHS, bench.MAX_BATCH_SIZE, bench.MAX_FANOUT) == (
        base.MAX_EPOCHS,
        base.MAX_BATCH_SIZE,
        base.MAX_FANOUT,
    )
    assert (bench.MAX_LAYERS, bench.MAX_HIDDEN) == (base.MAX_LAYERS, base.MAX_HIDDEN)
    (le,) = [
        m.le for m in RuntimeSpec.model_fields["parameter_servers"].metadata if hasattr(m, "le")
    ]
    from graphrun.cli.ps import MAX_INDEX

    assert le - 1 == MAX_INDEX
