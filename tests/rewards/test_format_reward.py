"""Tests for rlkit.rewards.format.FormatReward."""

from __future__ import annotations

import re

import pytest

from rlkit.errors import InvalidInputError
from rlkit.rewards import FormatReward, RewardResult


@pytest.mark.parametrize(
    "completion",
    [
        "Work.\n#### 18",
        "#### 1,000",
        "####-5",
        "#### $12.50",
        "  #### .5",
        "So \\boxed{42}.",
        "\\boxed{\\frac{3}{4}}",
        "\\boxed {x^2}",
    ],
)
def test_default_pattern_matches(completion):
    result = FormatReward()(completion, {})
    assert isinstance(result, RewardResult)
    assert result.reward == 1.0 and result.metrics == {"format_ok": 1.0, "too_long": 0.0}


@pytest.mark.parametrize(
    "completion",
    ["", "The answer is 18.", "#### eighteen", "text #### 18 inline", "\\boxed{}", "\\boxed{ }",
     "## 18"],
)
def test_default_pattern_misses(completion):
    result = FormatReward()(completion, {})
    assert result.reward == 0.0 and result.metrics["format_ok"] == 0.0


def test_custom_pattern_and_values():
    pattern = r"(?s)<think>.+</think>\s*<answer>.+</answer>"
    reward = FormatReward(pattern=pattern, match_reward=0.5, miss_reward=-0.5)
    assert reward("<think>hmm</think> <answer>4</answer>", {}).reward == 0.5
    assert reward("<answer>4</answer>", {}).reward == -0.5
    compiled = FormatReward(pattern=re.compile(r"answer", re.IGNORECASE))
    assert compiled("ANSWER: 3", {}).metrics["format_ok"] == 1.0


def test_max_chars_penalty():
    reward = FormatReward(max_chars=10, length_penalty=0.3)
    short = reward("#### 18", {})
    long = reward("x" * 20 + "\n#### 18", {})
    assert short.reward == 1.0 and short.metrics["too_long"] == 0.0
    assert long.reward == pytest.approx(0.7) and long.metrics == {"format_ok": 1.0, "too_long": 1.0}
    assert FormatReward()("x" * 100_000 + "\n#### 1", {}).reward == 1.0  # off by default


def test_name_and_bad_arguments():
    assert FormatReward.name == "format"
    with pytest.raises(InvalidInputError, match="invalid regex"):
        FormatReward(pattern="(")
    with pytest.raises(InvalidInputError, match="max_chars"):
        FormatReward(max_chars=-1)
