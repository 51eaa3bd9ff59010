"""code_grpo through the CLI on the tiny model: a 2-step two-turn run with real sandboxed grading,
plus the full-scale and CPU presets composing to the configuration they promise."""

import json
import os
from pathlib import Path

import yaml
import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def rlkit(*args, cwd):
    return warm_rlkit.run(args, cwd=cwd, env=dict(os.environ), timeout=600)


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).exists() else []


def test_two_step_code_grpo_smoke_run(tmp_path):
    out = rlkit("train", "recipe=code_grpo_smoke", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "checkpoints.jsonl"):
        assert (run / name).exists(), name
    metrics = lines(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for step in metrics[:2]:
        for key in ("reward/mean", "reward/all_passed", "reward/pass_fraction", "reward/has_code", "reward/timeout_fraction",
                    "reward/turn1_has_code", "reward/turns", "tokens/sampled", "tokens/trained", "time/reward_cpu"):
            assert key in step, key
        assert step["reward/turns"] == 2.0  # every rollout went through both turns
        assert step["rollout/failed"] == 0.0
        assert step["reward/has_code"] == 1.0  # the ```python prefill makes every answer a program
    assert "eval/greedy_accuracy" in metrics[0] and "eval/pass@2" in metrics[-1]
    assert len(lines(run / "checkpoints.jsonl")) == 2
    assert list((run / "transcripts").glob("step_*.jsonl"))


def test_presets_compose(tmp_path):
    full = rlkit("train", "recipe=code_grpo", "--cfg", "job", cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    cfg = yaml.safe_load(full.stdout)
    t = cfg["train"]
    assert (t["steps"], t["groups_per_batch"], t["group_size"], t["rollout"]["max_turns"], t["eval"]["problems"]) == (50, 128, 8, 2, 200)
    assert t["task"]["name"] == "code" and t["task"]["dataset"] == "codecontests"
    cpu = rlkit("train", "recipe=code_grpo_cpu", "--cfg", "job", cwd=tmp_path)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    c = yaml.safe_load(cpu.stdout)
    assert c["model"]["base_model"] == "smollm2-135m-instruct" and c["train"]["task"]["dataset"] == "mbpp"


def test_full_preset_runs_offline_on_the_local_fallback(tmp_path):
    """code_grpo shrunk to one step on the tiny model: the Hub is unreachable, the local file is used."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out = warm_rlkit.run(["train", "recipe=code_grpo", "model=tiny", "backend.num_threads=1",
                          "train.steps=1", "train.groups_per_batch=1", "train.group_size=2", "train.max_tokens=8",
                          "train.concurrency=1", "train.eval.problems=2", "train.eval.pass_k=0",
                          "train.task.sandbox_workers=1", "train.task.max_statement_chars=1000", f"run_dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "using codecontests/code_contests_test.json" in out.stderr
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    assert metrics[0]["reward/turns"] == 2.0 and metrics[-1]["eval/problems"] == 2.0


def test_sft_baseline_trains_on_mbpp_reference_programs(tmp_path):
    """``loop=task_sft`` (the SFT arm of ``rlkit repro``) on the code task: cross-entropy on the
    reference programs, evaluated by the same two-turn sandboxed eval; CodeContests (no solutions)
    is refused in one line."""
    out = rlkit("train", "recipe=code_grpo_smoke", "loop=task_sft", "train.steps=2", f"run_dir={tmp_path / 'sft'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    metrics = lines(tmp_path / "sft" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(m["train/nll"] > 0 and m["tokens/trained"] > 0 for m in metrics[:2])
    assert metrics[1]["train/nll"] < metrics[0]["train/nll"]  # the tiny model starts far from the programs
    assert "eval/greedy_accuracy" in metrics[0] and "eval/greedy_accuracy" in metrics[-1]
    cc = rlkit("train", "recipe=code_grpo_smoke", "loop=task_sft", "train.task.dataset=codecontests", "train.task.num_train=2",
               f"run_dir={tmp_path / 'cc'}", cwd=tmp_path)
    assert cc.returncode == 2 and "no reference answers" in cc.stderr and "Traceback" not in cc.stderr
