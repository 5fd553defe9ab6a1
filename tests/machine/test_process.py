"""The supervisor with real processes: exits, prefixes, logs, stop with SIGTERM/SIGKILL."""

from __future__ import annotations

import io
import sys
import time

import psutil
import pytest

from graphrun.machine.process import RoleCommand, Supervisor

PY = sys.executable


def py(role: str, code: str, machine: str = "m0") -> RoleCommand:
    return RoleCommand(role, machine, (PY, "-c", code))


def test_output_is_prefixed_and_logged(tmp_path):
    sink = io.StringIO()
    with Supervisor(log_dir=tmp_path, sink=sink) as sup:
        sup.start(py("trainer:0", "print('hello'); print('world')"))
        ended = sup.wait_any(timeout=30)
    assert [e.role for e in ended] == ["trainer:0"] and ended[0].ok
    assert "[trainer:0@m0] hello\n" in sink.getvalue()
    assert (tmp_path / "trainer-0.log").read_text() == "hello\nworld\n"


def test_failure_carries_exit_code_and_reason():
    sink = io.StringIO()
    with Supervisor(sink=sink) as sup:
        sup.start(py("trainer:1", "raise RuntimeError('boom')", machine="m1"))
        (ended,) = sup.wait_any(timeout=30)
    assert ended.exit_code == 1 and ended.machine == "m1"
    assert ended.reason() == "RuntimeError: boom"


@pytest.mark.integration
def test_stop_kills_sigterm_ignorers_and_their_children():
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    sup = Supervisor(sink=io.StringIO(), grace_s=0.5)
    sup.start(py("store:0", code))
    pid = sup.pids()["store:0"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not psutil.Process(pid).children():
        time.sleep(0.05)
    child = psutil.Process(pid).children()[0]
    sup.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert sup.exits()["store:0"].exit_code == -9


def test_the_reason_is_the_exception_line_not_the_last_line():
    # torch.distributed's errors go on over several lines; the summary quoted the last one
    # ("...you can set the environment variable TORCH_DISTRIBUTED_DEBUG...")
    from graphrun.machine.process import RoleExit

    tail = (
        "[rank1] step 3",
        "Traceback (most recent call last):",
        '  File "x.py", line 3, in <module>',
        "    loss.backward()",
        "    ^^^^^^^^^^^^^^^",
        "RuntimeError: Expected to have finished reduction in the prior iteration before",
        "starting a new one. This error indicates that your module has parameters that",
        "you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or",
    )
    assert RoleExit("trainer:1", "m1", 1, tail).reason() == (
        "RuntimeError: Expected to have finished reduction in the prior iteration before"
    )
    assert RoleExit("t", "m", 1, ("just a line", "")).reason() == "just a line"


def test_exit_now_keeps_what_was_written_and_the_exit_code(tmp_path):
    """Roles end with exit_now (no interpreter finalisation: 1.5 s with torch and PyG
    loaded); buffered output and log records must still come out."""
    import subprocess
    import sys

    code = (
        "import logging, sys\n"
        f"logging.basicConfig(filename={str(tmp_path / 'log')!r})\n"
        "logging.getLogger('x').warning('logged')\n"
        "sys.stdout.write('unflushed')\n"
        "from graphrun.machine.process import exit_now\n"
        "exit_now(3)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3 and res.stdout == "unflushed"
    assert "logged" in (tmp_path / "log").read_text()
