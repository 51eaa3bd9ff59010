"""`rlkit train` on OpenEnv environments a user wrote (tests/envs/guess_env.py), as the documented
config alone: in process, and served by rlkit on openenv's own server (episodes that crash or hang
are counted, not fatal; the server dies with rlkit, even under kill -9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlkit import cli

pytestmark = pytest.mark.slow  # whole runs and subprocesses: outside the fast tier (-m 'not slow')
HERE = Path(__file__).parent
SERVER = "rlkit.tasks.envs.openenv_server"


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_users_environment_trains_in_process_by_overriding_env_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(HERE)
    run = tmp_path / "run"
    assert cli.main(["train", "recipe=openenv_grpo_smoke", "train.task.env=guess_env:EchoWord", "logger.console=false",
                     f"run_dir={run}"]) == 0
    steps = metrics(run)
    assert [m["step"] for m in steps if "reward/mean" in m] == [0, 1]
    assert all(m["tokens/sampled"] > 0 and m["rollout/failed"] == 0 for m in steps if "reward/mean" in m)
    assert all(m["reward/turns"] == 1.0 for m in steps if "reward/turns" in m)  # EchoWord is one turn


def test_served_by_rlkit_failing_episodes_are_counted_and_the_run_finishes(tmp_path, monkeypatch):
    monkeypatch.chdir(HERE)
    run = tmp_path / "run"
    assert cli.main(["train", "recipe=openenv_grpo_smoke", "train.task.env=guess_env:FlakyGuess", "+train.task.serve=true",
                     "train.rollout.timeout_s=1", "train.groups_per_batch=4", "train.rollout.max_failed_steps=0",
                     "logger.console=false", f"run_dir={run}"]) == 0
    steps = [m for m in metrics(run) if "reward/mean" in m]
    assert len(steps) == 2 and sum(m["rollout/failed"] for m in steps) > 0
    assert not _server_pids()  # the run's end stopped its server


def _server_pids():
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if SERVER.encode() in cmd and int(entry) != os.getpid():
                pids.append(int(entry))
    return pids


def test_kill_9_of_rlkit_leaves_no_environment_server(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    for attempt in range(2):
        before = set(_server_pids())
        proc = subprocess.Popen([sys.executable, "-m", "rlkit", "train", "recipe=openenv_grpo_smoke", "+train.task.serve=true",
                                 "train.steps=200", f"run_dir={tmp_path / f'run{attempt}'}"], cwd=HERE, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not set(_server_pids()) - before and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        started = set(_server_pids()) - before
        assert started, "the environment server never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while set(_server_pids()) & started and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(_server_pids()) & started
