"""Processes rlkit starts die with it (rlkit/lifetime.py): a real rlkit process starts a vLLM
server through the real launch path (``LaunchedServer``, pointed at the stub vLLM of
tests/backends/vllm_stub.py) or a sandboxed program through ``run_program``, is killed with
SIGKILL, and within a bounded time none of the processes it started is left.

One driver process imports rlkit once; each trial forks a fresh rlkit process from it, so the
three SIGKILL trials (one launching from a worker thread that has exited by the kill: Linux's
parent-death signal would follow that thread) cost seconds, not three imports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Set

import pytest

from rlkit.lifetime import spawn

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "tests" / "backends" / "vllm_stub.py"

DRIVER = r"""
import os, sys, threading, time
from pathlib import Path
from rlkit.backends.vllm.launch import LaunchedServer
from rlkit.sandbox import SandboxLimits, run_program

fake, tmp = sys.argv[1], Path(sys.argv[2])
assert run_program("print(1)").verdict == "ok"  # the sandbox's self-check, once, before any trial forks

SERVERS = []  # held, as a user holds them: a dropped LaunchedServer stops its server when collected

def launch(i):
    SERVERS.append(LaunchedServer("tiny", "tiny", tmp / f"vllm-{i}.log", python=fake, startup_timeout_s=60))

def trial(kind, i):
    if kind == "vllm":
        launch(i)
    elif kind == "vllm-thread":  # started from a thread that has ended by the time rlkit is killed
        t = threading.Thread(target=launch, args=(i,)); t.start(); t.join()
    else:
        threading.Thread(target=run_program, args=("import time\ntime.sleep(50)",),
                         kwargs={"limits": SandboxLimits(wall_time_s=50, cpu_time_s=5)}, daemon=True).start()
    print("ready", os.getpid(), flush=True)
    time.sleep(600)

for i, line in enumerate(sys.stdin):
    pid = os.fork()
    if pid == 0:
        trial(line.strip(), i)
        os._exit(0)
    print("forked", pid, flush=True)
    os.waitpid(pid, 0)
"""


def _stat(pid: int) -> Optional[List[str]]:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def descendants(pid: int) -> Set[int]:
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lifetime")
    fake = tmp / "python"  # a fake vLLM environment: its python runs the stub server
    fake.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = {str(STUB)!r}\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    fake.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(fake), str(tmp)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    yield proc
    proc.stdin.close()
    proc.kill()
    proc.wait(10)


def _trial(driver, kind: str) -> Set[int]:
    """Fork an rlkit process that starts ``kind``; returns its pid once the child is up."""
    driver.stdin.write(kind + "\n")
    driver.stdin.flush()
    forked = driver.stdout.readline().split()
    assert forked[:1] == ["forked"], forked
    ready = driver.stdout.readline().split()
    assert ready[:1] == ["ready"], f"the rlkit process did not start its child: {ready}"
    return int(ready[1])


@pytest.mark.parametrize("kind", ["vllm", "vllm-thread", "vllm"])
def test_a_launched_vllm_server_dies_with_rlkit_on_sigkill(driver, kind):
    rlkit_pid = _trial(driver, kind)
    try:
        started = descendants(rlkit_pid)
        assert any(str(STUB) in _cmdline(p) or "vllm.entrypoints" in _cmdline(p) for p in started), "no server was started"
    finally:
        os.kill(rlkit_pid, signal.SIGKILL)  # also on a failed check: the driver waits for this trial before the next
    _wait_for(lambda: not any(alive(p) for p in started), 10.0, f"the processes rlkit started ({sorted(started)}) to end")


def test_a_sandboxed_program_dies_with_rlkit_on_sigkill(driver):
    rlkit_pid = _trial(driver, "sandbox")
    program = _wait_for(lambda: [p for p in descendants(rlkit_pid) if "main.py" in _cmdline(p)], 20.0, "the sandboxed program")
    started = descendants(rlkit_pid)
    assert set(program) <= started
    os.kill(rlkit_pid, signal.SIGKILL)  # its wall limit (50 s) and the launcher's backstop are far off
    _wait_for(lambda: not any(alive(p) for p in started), 10.0, f"the sandbox's processes ({sorted(started)}) to end")


def test_spawn_passes_the_exit_status_and_signals_through():
    assert spawn([sys.executable, "-c", "raise SystemExit(3)"]).wait(30) == 3
    child = spawn(["sleep", "30"])
    time.sleep(0.2)
    child.terminate()  # to the group: the program gets it, the watchdog passes its death on
    assert child.wait(30) == -signal.SIGTERM
    assert spawn(["/nonexistent/program"], stderr=subprocess.DEVNULL).wait(30) == 127


def test_end_group_asks_then_kills_what_is_left():
    """``end_group`` (the vLLM server's stop and the sandbox's kill): a group that ends when asked
    ends without SIGKILL; one whose processes ignore the signal is SIGKILLed after the grace."""
    from rlkit.lifetime import end_group, group_alive

    polite = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert end_group(polite.pid, lambda: polite.poll() is not None, grace_s=10) is True
    assert polite.returncode == -signal.SIGTERM
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(30)"], start_new_session=True, stdout=subprocess.PIPE)
    assert stubborn.stdout.readline().strip() == b"ready"
    assert end_group(stubborn.pid, lambda: stubborn.poll() is not None, grace_s=0.5) is False
    assert stubborn.wait(10) == -signal.SIGKILL and not group_alive(stubborn.pid)
    assert end_group(stubborn.pid, lambda: False) is True  # a group already gone is done
