"""Ranks die with rlkit (issue 51 item 1): ``kill -9`` of the process that launched N ranks — the
``rlkit`` command under ``backend.nproc=N``, ``rlkit serve tinker --nproc N``, ``rlkit conformance
local --nproc N``, or any caller of :func:`rlkit.backends.local.distributed.launch` — leaves no rank
running a few seconds later (:func:`rlkit.lifetime.die_with_launcher`). A run killed that way
resumes at once: tests/backends/test_local_ranks_train.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import List

import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

WORKER = Path(__file__).with_name("ranks_fault_worker.py")
GONE_WITHIN_S = 10.0


def ranks_marked(marker: str) -> List[int]:
    """Pids of ranks (``LOCAL_RANK`` set) whose environment carries ``RLKIT_TEST_LAUNCH=marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and f"RLKIT_TEST_LAUNCH={marker}".encode() in environ and any(e.startswith(b"LOCAL_RANK=") for e in environ):
            pids.append(int(entry))
    return pids


def kill_launcher_and_count_survivors(proc: subprocess.Popen, marker: str, ranks: int = 2, wait_s: float = 240,
                                      settle_s: float = 1.0) -> float:
    """Wait until ``ranks`` ranks run, SIGKILL the launcher, and return how long the last rank outlived
    it (fails if one is still alive after :data:`GONE_WITHIN_S`)."""
    deadline = time.monotonic() + wait_s
    while len(ranks_marked(marker)) < ranks:
        assert proc.poll() is None, f"the launcher ended before its ranks ran: {proc.returncode}"
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    time.sleep(settle_s)  # mid-run: the ranks are past their start
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    killed = time.monotonic()
    while ranks_marked(marker):
        if time.monotonic() - killed > GONE_WITHIN_S:
            for pid in ranks_marked(marker):
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"a rank outlived its killed launcher by more than {GONE_WITHIN_S} s")
        time.sleep(0.1)
    return time.monotonic() - killed


def _start(argv: List[str], marker: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLKIT_TEST_LAUNCH": marker}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


LAUNCHERS = {
    # distributed.launch from a program of the user's (the ranks' parent is that program)
    "launch()": lambda tmp: [sys.executable, "-c", "import sys; from rlkit.backends.local.distributed import launch; "
                             f"sys.exit(launch(2, ['run', {str(WORKER)!r}, 'sleep']))"],
    "rlkit serve tinker --nproc 2": lambda tmp: [sys.executable, "-m", "rlkit", "serve", "tinker", "--nproc", "2", "--port", "0",
                                                  "--state-dir", str(tmp), "--num-threads", "1"],
    "rlkit conformance local --nproc 2": lambda tmp: [sys.executable, "-m", "rlkit", "conformance", "local", "--nproc", "2"],
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_kill_9_of_the_launcher_leaves_no_rank(launcher, tmp_path):
    marker = uuid.uuid4().hex
    proc = _start(LAUNCHERS[launcher](tmp_path), marker)
    try:
        outlived = kill_launcher_and_count_survivors(proc, marker)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert outlived < GONE_WITHIN_S


def test_repeatedly_no_rank_outlives_a_killed_launcher(tmp_path):
    """The same kill three times over (the parent-death signal and the watch thread race nothing)."""
    for _ in range(3):
        marker = uuid.uuid4().hex
        proc = _start(LAUNCHERS["launch()"](tmp_path), marker)
        try:
            kill_launcher_and_count_survivors(proc, marker)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_the_rank_side_alone(tmp_path):
    """A process told it is a rank of a launcher that is not its parent exits at once (137), and
    what a rank starts does not inherit the launcher's name."""
    code = ("import os; os.environ['RLKIT_LAUNCHER_PID'] = '1'; from rlkit.lifetime import die_with_launcher; "
            "die_with_launcher(); print('survived')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 137 and "survived" not in proc.stdout
    code = ("import os, subprocess, sys; os.environ['RLKIT_LAUNCHER_PID'] = str(os.getppid()); "
            "from rlkit.lifetime import die_with_launcher; print(die_with_launcher(), 'RLKIT_LAUNCHER_PID' in os.environ)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "False"], proc.stderr
