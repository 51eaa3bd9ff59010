"""Smoke recipes on 2 ranks (gloo, CPU, the tiny model) write the one-process run's numbers (issue 42
item 5): GRPO under ``torchrun -m rlkit train`` (its rollouts shared by the ranks), DPO (a loss over the whole batch: every rank runs the whole batch, each backpropagating
loss / 2) and on-policy prompt distillation (its ranks sample the same rollouts: a seeded draw
does not follow float noise) under ``rlkit train ... backend.nproc=2`` (SFT under both launch commands:
test_local_ranks_train.py). Per-step losses and grad norms within
relative 1e-5, as tests/backends/test_local_ranks_train.py (SFT, full fine-tuning, backend.nproc=2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

LAUNCH = {"one": [sys.executable, "-m", "rlkit", "train"],
          "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "rlkit", "train"]}


def _train(run_dir, launch, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if launch == "one":  # rlkit itself (backend.nproc=2: its launcher starts the ranks)
        proc = warm_rlkit.run(["train", *args, "backend.precision=fp32", f"run_dir={run_dir}"], env=env, timeout=400)
    else:
        proc = subprocess.run([*LAUNCH[launch], *args, "backend.precision=fp32", f"run_dir={run_dir}"], env=env,
                              capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same(one, two, keys, rel=1e-5, abs=1e-7):
    assert [x["step"] for x in one] == [x["step"] for x in two]
    compared = 0
    for x, y in zip(one, two):
        for key in keys:
            assert (key in x) == (key in y), (x["step"], key)
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=rel, abs=abs), (x["step"], key)
                compared += 1
    assert compared >= 2 * len(keys) - 2  # the keys are there: a renamed metric must not pass vacuously


def test_dpo_smoke_on_backend_nproc_2_equals_one_process(tmp_path):
    args = ["recipe=dpo_gsm8k_smoke"]
    one = _train(tmp_path / "one", "one", *args)
    two = _train(tmp_path / "two", "one", *args, "backend.nproc=2")
    _same(one, two, ("train/loss", "train/grad_norm", "eval/loss"))


def test_prompt_distillation_smoke_on_backend_nproc_2_equals_one_process(tmp_path):
    """Both ranks sample the student's rollouts and the teacher scores them; the same-batch check
    would stop the run in one line if a rank's batch differed (it did with the inverse-CDF draw).
    The sampler's and teacher's logprobs come from batches composed by arrival, so they round
    differently per run: rel 1e-4 / abs 1e-6, the shared runs' tolerance (docs/guarantees.md)."""
    one = _train(tmp_path / "one", "one", "recipe=prompt_distillation_smoke")
    two = _train(tmp_path / "two", "one", "recipe=prompt_distillation_smoke", "backend.nproc=2")
    _same(one, two, ("train/loss", "train/reverse_kl", "train/grad_norm"), rel=1e-4, abs=1e-6)


def test_grpo_smoke_under_torchrun_equals_one_process(tmp_path):
    """RL under ``torchrun -m rlkit train``: each rank rolls out half the groups (rlkit.rl.rank_rollouts,
    tests/rl/test_rank_rollouts.py) and every rank trains on all of them; rewards, grad norms and
    the held-out evaluation are the one-process run's (the sampler's batches differ in size, so
    its logprobs round differently: rel 1e-4)."""
    args = ["recipe=arithmetic_grpo_signal_smoke"]
    one = _train(tmp_path / "one", "one", *args)
    two = _train(tmp_path / "two", "torchrun", *args)
    _same(one, two, ("reward/mean", "train/grad_norm", "eval/greedy_reward_mean"), rel=1e-4, abs=1e-6)
