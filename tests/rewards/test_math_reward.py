"""Tests for rlkit.rewards.math: extraction, grading, the timeout path, MathAnswerReward."""

from __future__ import annotations

import json
import signal
import threading
import time
from fractions import Fraction

import pytest

from rlkit.errors import DataError, InvalidInputError
from rlkit.rewards import (
    FormatReward,
    MathAnswerReward,
    WeightedSum,
    answers_match,
    extract_answer,
    parse_reference,
)
from rlkit.data import SHIPPED_DATA
from rlkit.rewards import math as math_reward

GSM8K_TEST = SHIPPED_DATA / "gsm8k" / "test.jsonl"  # the byte-identical copy the package ships


def _gsm8k_rows() -> list[dict]:
    with GSM8K_TEST.open() as fh:
        return [json.loads(line) for line in fh]


# ------------------------------------------------------------------------------ GSM8K, all rows


def test_gsm8k_every_reference_grades_itself_and_rejects_plus_one():
    rows = _gsm8k_rows()
    assert len(rows) == 1319
    for i, row in enumerate(rows):
        ref = parse_reference(row["answer"])
        as_written = row["answer"].rsplit("####", 1)[1].strip()  # e.g. "1,000"
        renderings = [
            f"Some work.\n#### {as_written}",
            f"So the total is \\boxed{{{ref}}}.",
            f"The answer is ${ref}.",
            row["answer"],  # the raw worked solution
        ]
        for text in renderings:
            predicted = extract_answer(text)
            assert answers_match(predicted, ref), (i, text[-60:], predicted, ref)
        wrong = Fraction(ref) + 1
        assert not answers_match(extract_answer(f"#### {wrong}"), ref), (i, ref)
        assert not answers_match(extract_answer(f"\\boxed{{{wrong}}}"), ref), (i, ref)


def test_gsm8k_every_reference_through_math_verify():
    """Expressions skip the fast path, so every row is graded by math-verify itself."""
    for i, row in enumerate(_gsm8k_rows()):
        ref = parse_reference(row["answer"])
        assert math_reward.grade(f"{ref}+0", ref) == (True, "math_verify"), (i, ref)
        assert math_reward.grade(f"{ref}+1", ref) == (False, "math_verify"), (i, ref)


def test_gsm8k_thousands_separators_and_negatives_parse():
    rows = _gsm8k_rows()
    finals = {r["answer"].rsplit("####", 1)[1].strip(): parse_reference(r["answer"]) for r in rows}
    assert any("," in k for k in finals) and any(k.startswith("-") for k in finals)
    assert all(ref == written.replace(",", "") for written, ref in finals.items())


# ----------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Work...\n#### 1,000", "1000"),
        ("#### 5\nmore text\n#### 7", "7"),  # the last #### line
        ("#### $18.", "18"),
        ("#### -5", "-5"),
        ("so it is \\boxed{1000}.", "1000"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # the last box
        ("\\boxed{\\frac{3}{4}}", "3/4"),
        ("\\boxed{-\\frac{3}{4}}", "-3/4"),
        ("\\boxed{\\dfrac{1}{2}}", "1/2"),
        ("\\boxed{{12}}", "12"),  # nested braces
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),  # nested, kept for math-verify
        ("\\boxed{1,000 \\text{ dollars}}", "1000"),
        ("The answer is $1000.", "1000"),
        ("The answer is $1,000.50.", "1000.5"),
        ("The final answer is 12 dollars.", "12"),
        ("Answer: 5 cm", "5"),
        ("answer: 50%", "50"),
        ("The answer is \\(\\frac{3}{4}\\).", "3/4"),
        ("The answer is -2.5.", "-2.5"),
        ("The answer is x^2+1.", "x^2+1"),
        ("The answer is that she has 12 apples left.", "12"),
        ("Final answer: **42**", "42"),
        ("#### The total is 18 eggs", "18"),  # via the last number
        ("#### Step 1\nadd 2 and 3\n#### Step 2\nso \\boxed{5}", "5"),  # headings skipped
        ("\\boxed{1,2}", "1,2"),  # a list, not 12
        ("\\boxed{A}", "A"),
        ("\\boxed{\\text{B}}", "B"),
        ("answer = 7", "7"),
        ("She has 3 apples and buys 4 more, so 7.", "7"),  # last number
        ("It costs $1,234.", "1234"),
        ("He ran 60 km/h for 3/4 of an hour", "3/4"),
        ("The temperature fell to -7 degrees", "-7"),
        ("It is 0.50 of the total", "0.5"),
        ("The area is 25 m^2", "25"),
        ("16 - 3 - 4 = <<16-3-4=9>>9 eggs", "9"),
        ("We get 12 \u2212 15 = \u22123", "-3"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text", ["", None, "no numbers at all", "\\boxed{}"])
def test_extract_answer_none(text):
    assert extract_answer(text) is None


# -------------------------------------------------------------------------------------- grading


@pytest.mark.parametrize(
    "predicted, reference",
    [
        ("1000", "1,000"),
        ("$1,000.00", "1000"),
        ("0.75", "3/4"),
        ("\\frac{3}{4}", "0.75"),
        ("-\\frac{1}{2}", "-0.5"),
        ("50%", "50"),
        ("12 dollars", "12"),
        ("0.333333333", "1/3"),  # within 1e-6 relative
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),  # math-verify
        ("1+x^2", "x^2+1"),
    ],
)
def test_answers_match_true(predicted, reference):
    assert answers_match(predicted, reference)


@pytest.mark.parametrize(
    "predicted, reference",
    [
        ("1450001", "1450000"),  # integers compare exactly despite the 1e-6 tolerance
        ("1,2", "12"),
        ("0.76", "3/4"),
        ("-5", "5"),
        ("x^2+2", "x^2+1"),
        (None, "5"),
        ("", "5"),
        ("5", None),
    ],
)
def test_answers_match_false(predicted, reference):
    assert not answers_match(predicted, reference)


def test_answers_match_from_worker_threads():
    results: dict[int, bool] = {}

    def work(k: int) -> None:
        same = answers_match("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}")
        results[k] = same and not answers_match("x^2+2", "x^2+1")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {k: True for k in range(4)}


def _slow_math_verify(predicted, reference):
    time.sleep(5)
    return True


@pytest.mark.parametrize("in_thread", [False, True])
def test_timeout_falls_back_to_numbers(monkeypatch, in_thread):
    monkeypatch.setattr(math_reward, "_math_verify", _slow_math_verify)
    out: list = []

    def work() -> None:
        start = time.monotonic()
        out.append(math_reward.grade("\\approx 5", "5", timeout_s=0.2))
        out.append(math_reward.grade("\\approx 6", "5", timeout_s=0.2))
        out.append(time.monotonic() - start)

    if in_thread:
        t = threading.Thread(target=work)
        t.start()
        t.join(10)
    else:
        work()
    assert out[0] == (True, "fallback") and out[1] == (False, "fallback")
    assert out[2] < 2.0


def test_timeout_restores_callers_alarm(monkeypatch):
    monkeypatch.setattr(math_reward, "_math_verify", _slow_math_verify)
    fired: list[int] = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        assert math_reward.grade("\\approx 5", "5", timeout_s=0.1) == (True, "fallback")
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < remaining <= 30 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_bad_timeout_rejected():
    with pytest.raises(InvalidInputError, match="timeout_s"):
        answers_match("x", "y", timeout_s=0)
    with pytest.raises(InvalidInputError, match="timeout_s"):
        MathAnswerReward(timeout_s=-1)


def test_math_verify_error_falls_back(monkeypatch):
    def broken(predicted, reference):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(math_reward, "_math_verify", broken)
    assert math_reward.grade("\\approx 5", "5") == (True, "fallback")


# ----------------------------------------------------------------------------- parse_reference


def test_parse_reference_ok():
    assert parse_reference("Work <<2*3=6>>6\n#### 1,000") == "1000"
    assert parse_reference("#### -12") == "-12"
    assert parse_reference("42") == "42"
    assert parse_reference("\\frac{1}{2}") == "1/2"
    assert parse_reference(7) == "7"


@pytest.mark.parametrize(
    "garbage", ["", "   ", "#### ", "a worked solution\nwith no final line", None, ["1"], "x" * 200]
)
def test_parse_reference_raises_data_error(garbage):
    with pytest.raises(DataError) as info:
        parse_reference(garbage)
    assert "\n" not in str(info.value) and "reference" in str(info.value)


# ----------------------------------------------------------------------------- MathAnswerReward


def test_math_reward_correct_and_wrong():
    reward = MathAnswerReward()
    problem = {"question": "?", "answer": "Work\n#### 1,000"}
    right = reward("So the answer is \\boxed{1000}.", problem)
    assert right.reward == 1.0
    assert right.metrics == {"correct": 1.0, "has_answer": 1.0, "grader_fallback": 0.0}
    assert right.info["predicted"] == "1000" and right.info["reference"] == "1000"
    wrong = reward("#### 999", problem)
    assert wrong.reward == 0.0 and wrong.metrics["correct"] == 0.0
    assert wrong.metrics["has_answer"] == 1.0


def test_math_reward_no_answer():
    result = MathAnswerReward()("I am not sure how to solve this.", {"answer": "#### 4"})
    assert result.reward == 0.0
    assert result.metrics["has_answer"] == 0.0 and result.metrics["correct"] == 0.0
    assert result.info["predicted"] is None


def test_math_reward_field_and_bare_reference():
    reward = MathAnswerReward(field="target")
    assert reward("The answer is 3/4.", {"target": "0.75"}).reward == 1.0
    assert reward("The answer is 3/4.", {"target": 0.75}).reward == 1.0
    with pytest.raises(DataError, match="'target'"):
        reward("#### 1", {"answer": "#### 1"})


def test_math_reward_reports_fallback(monkeypatch):
    monkeypatch.setattr(math_reward, "_math_verify", _slow_math_verify)
    result = MathAnswerReward(timeout_s=0.1)("\\boxed{\\approx 5}", {"answer": "#### 5"})
    assert result.reward == 1.0 and result.metrics["grader_fallback"] == 1.0
    assert result.info["graded_by"] == "fallback"


def test_weighted_sum_of_math_and_format():
    combo = WeightedSum([(1.0, MathAnswerReward()), (0.25, FormatReward())])
    problem = {"answer": "#### 18"}
    cases = {
        "She makes $18.\n#### 18": (1.0, 1.0),
        "She makes $17.\n#### 17": (0.0, 1.0),
        "She makes 18 dollars.": (1.0, 0.0),
        "No idea.": (0.0, 0.0),
    }
    for completion, (math_r, format_r) in cases.items():
        result = combo(completion, problem)
        assert result.reward == pytest.approx(1.0 * math_r + 0.25 * format_r)
        assert result.metrics["math/reward"] == math_r
        assert result.metrics["format/reward"] == format_r
        assert result.metrics["math/correct"] == math_r
        assert result.metrics["format/format_ok"] == format_r
        assert {"math/has_answer", "math/grader_fallback", "format/too_long"} <= set(result.metrics)
        assert result.info["math"]["reference"] == "18"
