"""Run directories: one live run per directory (a lock, tested across processes and after a
SIGKILL), nothing written before the config and data are accepted, values no run can use refused
up front — each refusal one line on stderr and exit code 2."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rlkit import cli
from rlkit.errors import ConfigError

from test_cli_train import TINY, assert_user_error, rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

HOLD_LOCK = """
import sys, time
from pathlib import Path
from rlkit.runs import RunLock
lock = RunLock.acquire(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("override, key", [
    ("train.steps=-3", "train.steps"), ("train.learning_rate=inf", "train.learning_rate"),
    ("train.learning_rate=nan", "train.learning_rate"), ("train.beta2=1.5", "train.beta2"),
    ("train.grad_clip_norm=0", "train.grad_clip_norm"), ("train.eval_every=-1", "train.eval_every"),
])
def test_values_no_run_can_use_are_refused_before_anything(override, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        cli.compose(["recipe=sft_gsm8k_smoke", override])


def test_rl_values_are_refused_too():
    for override in ("train.group_size=0", "train.temperature=-1", "train.max_tokens=0"):
        with pytest.raises(ConfigError, match=override.split("=")[0]):
            cli.compose(["recipe=arithmetic_grpo_smoke", override])


def test_bad_values_from_the_cli_write_nothing(tmp_path):
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", "train.steps=-3", "run_dir=r", cwd=tmp_path)
    assert_user_error(proc, "config key 'train.steps': -3 must be a positive integer")
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", "train.learning_rate=inf", "run_dir=r", cwd=tmp_path)
    assert_user_error(proc, "config key 'train.learning_rate'", "not a finite number")
    assert not (tmp_path / "r").exists()


def test_bad_data_writes_nothing_and_the_fixed_run_starts_clean(tmp_path):
    good = json.dumps({"question": "1+1?", "answer": "2\n#### 2"})
    data = tmp_path / "data.jsonl"
    data.write_text(f"{good}\n{{broken\n")
    args = [*TINY, "train.steps=1", "train.generate.examples=0", f"data.train.path={data}", "data.eval=null", "run_dir=r"]
    proc = rlkit("train", *args, cwd=tmp_path)
    assert_user_error(proc, "not valid JSON")
    assert not (tmp_path / "r").exists()
    data.write_text(f"{good}\n{good}\n")
    proc = rlkit("train", *args, cwd=tmp_path)  # the same command, now accepted: not "a different config"
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "r" / "result.json").read_text())  # no eval data: finished all the same
    assert result["status"] == "completed" and result["objective"] is None and "eval/nll" in result["note"]


def test_impossible_run_dirs_are_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", f"run_dir={tmp_path / 'afile'}", cwd=tmp_path)
    assert_user_error(proc, "is a file, not a directory")
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions: use a path under a file instead
            target = tmp_path / "afile" / "run"
        else:
            target = locked / "run"
        proc = rlkit("train", *TINY, "train.steps=1", f"run_dir={target}", cwd=tmp_path)
        assert_user_error(proc, "cannot write there")
    finally:
        locked.chmod(0o700)


def _hold(run_dir, cwd):
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir)], cwd=cwd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_live_lock_refuses_a_second_run_and_a_dead_one_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = [*TINY, "train.steps=1", "train.generate.examples=0", f"run_dir={run_dir}"]
    for _ in range(2):  # repeatedly: the refusal never depends on timing
        holder = _hold(run_dir, tmp_path)
        try:
            proc = rlkit("train", *args, cwd=tmp_path)
            assert_user_error(proc, f"run_dir {run_dir} is in use by another rlkit run (pid {holder.pid}")
            assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
    proc = rlkit("train", *args, cwd=tmp_path)  # the holder died holding it: taken over, said once
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("no longer alive") == 1 and f"pid {holder.pid}" in proc.stderr
    again = rlkit("train", *args, cwd=tmp_path)  # a run that closed cleanly leaves no stale lock behind
    assert again.returncode == 0 and "no longer alive" not in again.stderr


def test_two_runs_started_together_into_one_directory(tmp_path):
    """The race that once interleaved two sessions' checkpoints: the first run takes the lock (it
    is paused there with SIGSTOP so the test never depends on timing), the second is refused with
    exit 2, and the directory ends up holding one session's checkpoints."""
    args = [*TINY, "train.steps=6", "train.checkpoint_every=2", "train.generate.examples=0", "run_dir=run"]
    first = subprocess.Popen([sys.executable, "-m", "rlkit", "train", *args], cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (tmp_path / "run" / "config.yaml").exists():
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGSTOP)
        second = rlkit("train", *args, cwd=tmp_path)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert_user_error(second, "is in use by another rlkit run")
    steps = [json.loads(x)["step"] for x in (tmp_path / "run" / "checkpoints.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6]


def test_non_utf8_data_and_a_directory_as_data_are_one_line(tmp_path):
    from rlkit.data import load_records
    from rlkit.errors import DataError

    good = json.dumps({"question": "1+1?", "answer": "2\n#### 2"}).encode()
    (tmp_path / "latin1.jsonl").write_bytes(good + b"\n" + b'{"question": "caf\xe9", "answer": "x"}\n')
    with pytest.raises(DataError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9"):
        load_records({"path": str(tmp_path / "latin1.jsonl")}, name="data.train")
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(DataError, match="is a directory"):
        load_records({"path": str(tmp_path / "folder.jsonl")}, name="data.train")
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", f"data.train.path={tmp_path / 'latin1.jsonl'}", "run_dir=r", cwd=tmp_path)
    assert_user_error(proc, "not UTF-8 text")
    assert not (tmp_path / "r").exists()


FULL_DISK = """
import errno, sys
import rlkit.logging
def full(self, step, metrics):
    raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
rlkit.logging.JsonlSink.log = full
from rlkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_full_disk_mid_run_is_one_line_and_exit_2(tmp_path):
    """The file system fills up while the run writes its metrics (ENOSPC injected at the write)."""
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, "train", *TINY, "train.steps=1", "train.generate.examples=0", "run_dir=r"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    last = assert_user_error(proc, "No space left on device", "rerun the same command to resume")
    assert str(tmp_path / "r" / "metrics.jsonl") in last
