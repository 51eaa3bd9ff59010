"""``rlkit train ... backend.nproc=2`` — torch's elastic agent as ``torchrun --standalone
--nproc-per-node 2 -m rlkit train ...`` runs it — and that torchrun command itself (issue 42 items 2
and 5, gloo on CPU), and two nodes of one rank each (``torchrun --nnodes 2 ... --rdzv-endpoint``,
both on this machine): the SFT smoke recipe with full fine-tuning on 2 ranks writes one run (rank
0's) whose per-step losses, grad norms and evaluation equal the one-process run's (relative 1e-5), and a run stopped after a checkpoint written on 2 ranks resumes
on 1 rank with the same numbers. A rank count that cannot be honoured is one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ARGS = [
    "recipe=sft_gsm8k", "model=tiny", "model.lora=false", "backend.precision=fp32", "backend.num_threads=1",
    "data.train.limit=32", "data.eval.limit=4", "train.steps=2", "train.batch_tokens=1024", "train.warmup_steps=0",
    "train.checkpoint_every=1", "train.generate.examples=2", "train.generate.max_tokens=4",
]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _train(run_dir, *extra, timeout=300, rc=0, launcher=()):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if launcher:
        proc = subprocess.run([*launcher, "-m", "rlkit", "train", *ARGS, f"run_dir={run_dir}", *extra], env=env,
                              capture_output=True, text=True, timeout=timeout)
    else:
        proc = warm_rlkit.run(["train", *ARGS, f"run_dir={run_dir}", *extra], env=env, timeout=timeout)
    assert proc.returncode == rc, proc.stderr[-3000:]
    return proc


def _two_nodes(run_dir):
    """The several-nodes command (docs/scale.md): one ``torchrun --nnodes 2 --node-rank R
    --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` per node, here two on this machine."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(r), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                               "--rdzv-id", "two-nodes", "-m", "rlkit", "train", *ARGS, f"run_dir={run_dir}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]


def _lines(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same(a, b, keys=("train/loss", "train/grad_norm", "eval/nll")):
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b):
        for key in keys:
            assert (key in x) == (key in y)
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-5), (x["step"], key)


def test_two_ranks_write_one_run_equal_to_one_process_and_resume_on_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _train(one)
    proc = _train(two, "backend.nproc=2")
    assert proc.stdout.count("train step 1 (2/2)") == 1  # rank 0 alone prints the run's lines
    _same(_lines(one), _lines(two))
    _train(tmp_path / "torchrun", launcher=TORCHRUN)  # the same, launched by torchrun itself
    _same(_lines(one), _lines(tmp_path / "torchrun"))
    _two_nodes(tmp_path / "nodes")  # two nodes of one rank each (both on this machine, one filesystem)
    _same(_lines(one), _lines(tmp_path / "nodes"))
    assert not list(tmp_path.glob("*/.rank*"))
    # stopped after step 1's checkpoint (written on 2 ranks) was recorded: rerun into it on 1 rank
    records = (two / "checkpoints.jsonl").read_text().splitlines()
    assert len(records) == 2
    (two / "checkpoints.jsonl").write_text(records[0] + "\n")
    (two / "result.json").unlink()
    _train(two)
    _same(_lines(one), _lines(two))  # step 1 and the final evaluation recomputed on 1 rank: the same numbers


def test_a_rank_count_that_cannot_be_honoured_is_one_line(tmp_path):
    proc = _train(tmp_path / "run", "backend.nproc=0", rc=2)
    assert proc.stderr.strip().splitlines()[-1] == "rlkit: error: backend.nproc=0: expected a whole number of ranks >= 1"
    assert not (tmp_path / "run").exists()


def _rank_pid(run_dir, rank: int):
    """The pid of the worker process of ``rank`` training into ``run_dir`` (None until it exists)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if str(run_dir).encode() in cmdline and f"RANK={rank}".encode() in environ and b"LOCAL_RANK" in b"".join(environ):
            return int(entry)
    return None


def test_a_rank_killed_mid_run_ends_the_run_and_it_resumes_on_one_rank(tmp_path):
    """kill -9 of rank 1 after the first checkpoint: the run ends non-zero in bounded time (torchrun
    stops rank 0), nothing half-written is read back, and ``rlkit train`` resumes it on 1 rank."""
    import signal
    import time

    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rlkit", "train", *ARGS, "train.steps=40", "data.train.limit=64",
                             "backend.nproc=2", f"run_dir={run}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not ((run / "checkpoints.jsonl").exists() and (run / "checkpoints.jsonl").read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
            time.sleep(0.05)
        pid = _rank_pid(run, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)  # bounded: the surviving rank does not hang in a collective
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 137, stderr[-2000:]  # 128 + SIGKILL: the killed rank's, said in one line
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"rlkit: error: rank 1 (pid {pid}) was killed by SIGKILL") and "Traceback" not in stderr
    assert f"resume it with: rlkit train resume={run}" in line
    recorded = len((run / "checkpoints.jsonl").read_text().splitlines())
    resumed = _train(run, "train.steps=40", "data.train.limit=64", timeout=300)  # on 1 rank
    assert "resuming" in resumed.stderr + resumed.stdout and "from step 0" not in resumed.stderr + resumed.stdout
    steps = [m["step"] for m in _lines(run) if "train/loss" in m]
    assert steps[-1] == 39 and recorded >= 1
    assert json.loads((run / "result.json").read_text())["status"] == "completed"


def test_kill_9_of_the_launcher_after_a_checkpoint_leaves_no_rank_and_the_run_resumes_on_one(tmp_path):
    """Issue 51 item 1: ``kill -9`` of the ``rlkit train ... backend.nproc=2`` process after its first
    checkpoint: no rank is alive 10 s later (they die with the launcher, rlkit.lifetime), the run
    directory is free at once, and ``rlkit train`` resumes it on 1 process with the per-step numbers
    of the uninterrupted run."""
    import uuid

    from test_local_ranks_die_with_launcher import kill_launcher_and_count_survivors

    args = ["train.steps=12", "data.train.limit=64", "train.checkpoint_every=2"]
    _train(tmp_path / "uninterrupted", *args)
    run, marker = tmp_path / "run", uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLKIT_TEST_LAUNCH": marker}
    proc = subprocess.Popen([sys.executable, "-m", "rlkit", "train", *ARGS, *args, "backend.nproc=2", f"run_dir={run}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import time

    try:
        deadline = time.monotonic() + 240
        while not ((run / "checkpoints.jsonl").exists() and (run / "checkpoints.jsonl").read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
            time.sleep(0.02)
        kill_launcher_and_count_survivors(proc, marker, settle_s=0.0)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (run / "result.json").exists()  # killed mid-run
    resumed = _train(run, *args)  # on 1 process, at once: no rank holds the run directory
    assert "resuming" in resumed.stderr + resumed.stdout and "from step 0" not in resumed.stderr + resumed.stdout
    _same(_lines(tmp_path / "uninterrupted"), _lines(run))
