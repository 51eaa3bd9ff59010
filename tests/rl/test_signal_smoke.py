"""``recipe=arithmetic_grpo_signal_smoke``: on the tiny random model RL has signal (reward variance
and a nonzero gradient), where ``arithmetic_grpo_smoke`` has reward 0 and grad norm 0."""

import json

import pytest

from rlkit.errors import ConfigError
from rlkit.tasks.arithmetic import ArithmeticReward


def test_brevity_credit_is_partial_credit_below_a_correct_answer():
    problem = {"answer": "42"}
    assert ArithmeticReward()(" 7 apples", problem).reward == 0.0  # off by default
    reward = ArithmeticReward(brevity_credit=0.5)
    assert reward(" 42", problem).reward == 1.0 and reward(" 42", problem).metrics["brevity"] == 0.0
    assert reward(" 7", problem).reward == pytest.approx(0.5 / 2)
    assert reward(" 7 apples", problem).reward == pytest.approx(0.5 / 9)
    with pytest.raises(ConfigError, match="brevity_credit"):
        ArithmeticReward(brevity_credit=1.0)


def test_signal_smoke_recipe_has_reward_variance_and_gradient(tmp_path):
    from rlkit import cli

    cfg = cli.compose(["recipe=arithmetic_grpo_signal_smoke", "train.steps=2", "logger.console=false"])
    cli.execute(cfg, tmp_path / "run")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "train/grad_norm" in m]
    assert trained and any(m["train/grad_norm"] > 0 for m in trained), trained
    assert any(m["rollout/zero_variance_frac"] < 1 for m in trained)
