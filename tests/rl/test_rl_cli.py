"""The RL loop through the CLI on the tiny model: a 3-step arithmetic_grpo run, and SIGKILL + resume."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

TESTS = str(Path(__file__).resolve().parents[1] / "rl")


def rlkit(*args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return warm_rlkit.run(args, cwd=cwd, env=env, timeout=240, **kw)


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).exists() else []


def test_three_step_arithmetic_grpo_run(tmp_path):
    out = rlkit("train", "recipe=arithmetic_grpo_smoke", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "checkpoints.jsonl", "metrics.png"):
        assert (run / name).exists(), name
    metrics = lines(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    step = metrics[0]
    for key in ("reward/mean", "reward/accuracy", "mismatch/logprob_diff_abs", "policy/entropy_estimate",
                "rollout/zero_variance_frac", "tokens/prefill", "tokens/sampled", "tokens/trained",
                "time/rollout", "time/train", "time/loop_overhead", "eval/greedy_accuracy", "eval/pass@2"):
        assert key in step, key
    assert step["tokens/sampled"] > 0 and step["tokens/trained"] > 0
    assert step["mismatch/logprob_diff_abs"] < 1e-4
    assert "eval/greedy_accuracy" in metrics[-1] and "eval/greedy_accuracy" in metrics[2]
    assert len(lines(run / "checkpoints.jsonl")) == 3
    assert list((run / "transcripts").glob("step_*.jsonl"))


ARGS = [
    "recipe=arithmetic_grpo_smoke",
    "+train.task._target_=toy_task.ToyTask",
    "~train.task.name", "~train.task.ops", "~train.task.num_shots",
    "train.steps=8", "train.checkpoint_every=2", "train.eval_every=4",
    "train.max_tokens=6", "train.learning_rate=0.05",
    # concurrency=1 (the smoke recipe) and max_batch_rows=1: no request shares a decode batch, so
    # thread timing cannot change a logit's last digits (see README "reproducible runs")
    "backend.max_batch_rows=1",
]


def start(run_dir, cwd):
    env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "rlkit", "train", *ARGS, f"run_dir={run_dir}"], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_rl_sigkill_then_resume_equals_uninterrupted(tmp_path):
    ref = tmp_path / "ref"
    proc = start(ref, tmp_path)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    want = lines(ref / "metrics.jsonl")
    assert any(m.get("train/grad_norm", 0) > 0 for m in want), "the toy task must produce gradient"

    run = tmp_path / "run"
    proc = start(run, tmp_path)
    deadline = time.time() + 200
    while time.time() < deadline and len(lines(run / "checkpoints.jsonl")) < 2:
        time.sleep(0.01)
    assert proc.poll() is None, "finished before the kill point"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = rlkit("train", f"resume={run}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr

    got = lines(run / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(9))
    for g, w in zip(got, want):
        assert sorted(k for k in g if not k.startswith("time/")) == sorted(k for k in w if not k.startswith("time/"))
        for k, v in g.items():
            if not k.startswith("time/"):
                assert math.isclose(v, w[k], rel_tol=1e-6, abs_tol=1e-9), (g["step"], k, v, w[k])
    a = load_file(lines(run / "checkpoints.jsonl")[-1]["checkpoint"][len("local://"):] + "/adapter_model.safetensors")
    b = load_file(lines(ref / "checkpoints.jsonl")[-1]["checkpoint"][len("local://"):] + "/adapter_model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_gsm8k_grpo_smoke_runs(tmp_path):
    out = rlkit("train", "recipe=gsm8k_grpo_smoke", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert metrics[0]["tokens/sampled"] > 0 and "eval/greedy_accuracy" in metrics[-1]
    rows = [json.loads(x) for x in (tmp_path / "run" / "transcripts" / "step_000000.jsonl").read_text().splitlines()]
    assert rows and "question" in rows[0]["problem"] and "answer" in rows[0]["problem"]


def test_bad_rl_inputs_exit_2(tmp_path):
    bad_task = rlkit("train", "recipe=arithmetic_grpo_smoke", "train.task.name=chess", f"run_dir={tmp_path / 'a'}", cwd=tmp_path)
    assert bad_task.returncode == 2 and "task.name='chess': unknown task" in bad_task.stderr and "Traceback" not in bad_task.stderr
    bad_adv = rlkit("train", "recipe=arithmetic_grpo_smoke", "train.advantage=ppo", f"run_dir={tmp_path / 'b'}", cwd=tmp_path)
    assert bad_adv.returncode == 2 and "advantage estimator 'ppo'" in bad_adv.stderr
    missing = rlkit("train", "recipe=gsm8k_grpo_smoke", "+train.task.train_path=nope/train.jsonl", f"run_dir={tmp_path / 'c'}", cwd=tmp_path)
    assert missing.returncode == 2 and "nope/train.jsonl" in missing.stderr
