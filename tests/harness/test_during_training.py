"""train.eval.harness (rlkit/harness/during_training.py): lm-eval's tasks on the run's current weights
every K steps and at the end, overlapped with training, logged as harness/<task>/<metric>."""

from __future__ import annotations

import json

import pytest

from rlkit import cli
from rlkit.errors import ConfigError
from rlkit.harness.during_training import HarnessEval, HarnessEvalConfig, metrics_of


def test_lm_evals_results_become_flat_metrics_with_their_stderr():
    results = {"results": {"gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1,
                                     "exact_match,flexible-extract": 0.5, "exact_match_stderr,flexible-extract": "N/A"},
                           "mbpp": {"pass_at_1,none": 0.125, "pass_at_1_stderr,none": 0.05}}}
    assert metrics_of(results) == {
        "harness/gsm8k/exact_match/strict-match": 0.25, "harness/gsm8k/exact_match/strict-match_stderr": 0.1,
        "harness/gsm8k/exact_match/flexible-extract": 0.5,
        "harness/mbpp/pass_at_1": 0.125, "harness/mbpp/pass_at_1_stderr": 0.05}


def test_before_training_every_k_steps_and_the_end():
    harness = HarnessEval(HarnessEvalConfig(tasks=["gsm8k"], every=2), total=7)
    assert [d for d in range(8) if harness.due(d)] == [0, 2, 4]  # 6 is the last step's start: the final one covers it
    assert [d for d in range(3) if HarnessEval(HarnessEvalConfig(tasks=["gsm8k"]), total=2).due(d)] == [0]
    assert not any(HarnessEval(HarnessEvalConfig(), total=5).due(d) for d in range(5))  # no tasks: off
    with pytest.raises(ConfigError, match="every=-1"):
        HarnessEval(HarnessEvalConfig(tasks=["gsm8k"], every=-1), total=3).prepare()


def run_lines(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_training_run_logs_harness_metrics_mid_run_and_at_the_end(tmp_path):
    run = tmp_path / "run"
    assert cli.main(["train", "recipe=arithmetic_grpo_smoke", "train.steps=4", "train.eval.harness.tasks=[gsm8k]",
                     "train.eval.harness.limit=2", "train.eval.harness.every=1", "train.eval.harness.max_gen_toks=8",
                     "logger.console=false", f"run_dir={run}"]) == 0
    lines = run_lines(run)
    measured = [(m["step"], m["harness/step"]) for m in lines if "harness/step" in m]
    assert measured == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 4.0)]  # each in a later line (overlapped), the final at the end
    for m in lines:
        if "harness/step" in m:
            assert 0.0 <= m["harness/gsm8k/exact_match/strict-match"] <= 1.0
            assert "harness/gsm8k/exact_match/strict-match_stderr" in m


def test_an_unknown_harness_task_is_one_line_before_anything_runs(tmp_path, capsys):
    run = tmp_path / "run"
    try:
        code = cli.main(["train", "recipe=arithmetic_grpo_smoke", "train.eval.harness.tasks=[gsm8kk]", f"run_dir={run}"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "gsm8kk" in err[0] and "gsm8k" in err[0].replace("gsm8kk", ""), err
    assert not run.exists(), sorted(p.name for p in run.rglob("*"))  # nothing written: tasks resolved before the run starts
