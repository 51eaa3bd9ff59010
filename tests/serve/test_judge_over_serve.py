"""An LLM-as-judge reward served by ``rlkit serve`` (the tiny model) scores an RL run: the tiny
model's verdicts are mostly unparseable, and every such failure is counted while the run goes on;
the judge's tokens reach metrics.jsonl and ``rlkit cost``."""

import json

import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

pytest.importorskip("openai")


def test_judge_over_rlkit_serve_scores_a_run_and_counts_its_failures(tiny_server, api_key, tmp_path, capsys):
    from omegaconf import OmegaConf

    from rlkit import cli
    from rlkit.cost import actual
    from rlkit.cost_cli import cost_command

    cfg = cli.compose(["recipe=arithmetic_grpo_smoke", "train.steps=2", "train.eval_every=0", "train.eval.problems=0",
                       "logger.console=false", "train.rollout.max_failed_steps=0"])  # a step may fail whole: it must go on here
    OmegaConf.set_struct(cfg, False)
    cfg.train.task = {
        "name": "scored",
        "task": {"name": "arithmetic", "num_train": 8, "num_test": 2},
        "reward": {"_target_": "rlkit.rewards.judge:JudgeReward", "base_url": tiny_server.base_url, "model": "tiny",
                   "api_key": api_key, "max_tokens": 8, "temperature": 1.0, "max_retries": 0, "timeout_s": 30},
        "task_weight": 1.0,
    }
    run = tmp_path / "run"
    cli.execute(cfg, run)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "rollout/failed" in m]
    assert [m["step"] for m in steps] == [0, 1]  # the run went on
    rollouts = 3 * 4  # groups_per_batch x group_size
    for m in steps:
        assert m["rollout/failed"] == pytest.approx(m["reward/judge/failed"] * rollouts)  # each judge failure is a failed rollout
        assert m["tokens/judge_prompt"] > 0 and m["tokens/judge_completion"] > 0
    assert sum(m["rollout/failed"] for m in steps) > 0  # the tiny model rarely writes "Score: N"
    spent = actual(run)["judge"]
    assert spent == sum(m["tokens/judge_prompt"] + m["tokens/judge_completion"] for m in steps)
    capsys.readouterr()
    assert cost_command([f"run={run}", "judge_price=2.0"]) == 0
    out = capsys.readouterr().out
    assert f"LLM-as-judge reward (not in the above): {spent:,.0f} tokens" in out
