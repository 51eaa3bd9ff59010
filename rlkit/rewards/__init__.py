"""Reward functions: callables ``(completion, problem) -> float | RewardResult``."""

from rlkit.rewards.base import RewardResult, WeightedSum, as_result
from rlkit.rewards.code import (
    CodeExecutionReward,
    ExtractedProgram,
    TestCaseResult,
    TestReport,
    extract_program,
    outputs_match,
    run_assert_tests,
    run_stdio_tests,
)
from rlkit.rewards.code_data import load_codecontests, load_mbpp
from rlkit.rewards.format import FormatReward
from rlkit.rewards.math import MathAnswerReward, answers_match, extract_answer, parse_reference

__all__ = [
    "RewardResult",
    "WeightedSum",
    "as_result",
    "MathAnswerReward",
    "FormatReward",
    "extract_answer",
    "answers_match",
    "parse_reference",
    "CodeExecutionReward",
    "ExtractedProgram",
    "TestCaseResult",
    "TestReport",
    "extract_program",
    "outputs_match",
    "run_assert_tests",
    "run_stdio_tests",
    "load_mbpp",
    "load_codecontests",
]
