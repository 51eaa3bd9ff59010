"""Program extraction, stdin/stdout and assert grading, the code reward and the loaders."""

from __future__ import annotations

import json
import os

import pytest

from rlkit.errors import DataError
from rlkit.rewards.base import WeightedSum
from rlkit.rewards.code import (
    CodeExecutionReward,
    extract_program,
    outputs_match,
    run_assert_tests,
    run_stdio_tests,
)
from rlkit.data import SHIPPED_DATA
from rlkit.rewards.code_data import load_codecontests, load_mbpp
from rlkit.sandbox import SandboxLimits, SandboxPool

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

DATA = str(SHIPPED_DATA)  # the byte-identical copies the package ships
CC_FILE = os.path.join(DATA, "codecontests", "code_contests_test.json")
LIMITS = SandboxLimits(cpu_time_s=2, wall_time_s=5)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(2, limits=LIMITS) as p:
        yield p


# -- extract_program ---------------------------------------------------------------------------

def test_extract_zero_blocks():
    assert extract_program("I think the answer is print(1).").verdict == "no_code_block"
    assert extract_program("").source is None
    only_cpp = extract_program("```cpp\nint main() {}\n```")
    assert only_cpp.source is None and only_cpp.verdict == "no_python_block"


def test_extract_one_block_any_python_tag():
    for tag in ("python", "py", "Python3", ""):
        got = extract_program(f"Solution:\n```{tag}\ndef f():\n    return 1\n```\nDone.")
        assert got.verdict == "ok" and got.source == "def f():\n    return 1\n", tag
    tilde = extract_program("~~~python\nprint(2)\n~~~")
    assert tilde.source == "print(2)\n"


def test_extract_last_of_several_blocks():
    text = ("First try:\n```python\nprint('draft')\n```\nSome shell:\n```bash\nls\n```\n"
            "Final:\n```py\nprint('final')\n```\nand an example output:\n```text\nfinal\n```\n")
    got = extract_program(text)
    assert got.source == "print('final')\n" and got.n_blocks == 4 and got.verdict == "ok"


def test_extract_unterminated_and_empty_blocks():
    got = extract_program("```python\nprint('a')\n```\nNow better:\n```python\nx = 1\nprint(x)")
    assert got.verdict == "unterminated_block" and got.source == "x = 1\nprint(x)\n"
    assert extract_program("```python\n\n```").verdict == "empty_code_block"
    # a fence-like line inside a string literal does not close the block
    code = 's = """\n```python\n"""\nprint(s)'
    assert extract_program(f"```python\n{code}\n```").source.startswith('s = """')


# -- stdin/stdout grading ----------------------------------------------------------------------

def test_outputs_match_whitespace_insensitive():
    assert outputs_match("1 2 \n3\n\n", "1 2\n3")
    assert outputs_match("1\n2", "1 2  ")
    assert not outputs_match("1 2", "1 2 3")
    assert not outputs_match("0.3333", "0.333333")
    assert outputs_match("0.3333", "0.333333", float_tolerance=1e-3)
    assert not outputs_match("abc", "abd", float_tolerance=1e-3)


def test_stdio_trailing_whitespace_and_wrong_output(pool):
    inputs = ["3\n1 2 3\n", "2\n10 20\n"]
    outputs = ["6   \n", "30\n\n"]  # expected with trailing spaces / blank lines
    good = "n = int(input())\nprint(sum(map(int, input().split())), end='  \\n\\n\\n')"
    report = run_stdio_tests(good, inputs, outputs, limits=LIMITS, pool=pool)
    assert report.all_passed and report.pass_fraction == 1.0
    assert [c.verdict for c in report.cases] == ["passed", "passed"]
    wrong = "n = int(input())\nprint(sum(map(int, input().split())) + (n == 2))"
    report = run_stdio_tests(wrong, inputs, outputs, limits=LIMITS, pool=pool)
    assert [c.verdict for c in report.cases] == ["passed", "wrong_answer"]
    assert report.pass_fraction == 0.5 and not report.all_passed
    assert report.cases[1].output.strip() == "31" and report.cases[1].expected == "30\n\n"
    crash = run_stdio_tests("raise SystemExit(input())", inputs[:1], outputs[:1], limits=LIMITS)
    assert crash.cases[0].verdict == "runtime_error" and "3" in crash.cases[0].error
    with pytest.raises(DataError):
        run_stdio_tests("print(1)", ["1"], [], limits=LIMITS)


SQUARES_AND_CUBES = """
import sys
from math import isqrt

def iroot(n, k):
    r = int(round(n ** (1.0 / k)))
    while r ** k > n:
        r -= 1
    while (r + 1) ** k <= n:
        r += 1
    return r

data = sys.stdin.read().split()
for tok in data[1:1 + int(data[0])]:
    n = int(tok)
    print(isqrt(n) + iroot(n, 3) - iroot(n, 6))
"""


def test_codecontests_real_problem(pool):
    problems = load_codecontests(CC_FILE)
    problem = next(p for p in problems if p["problem"].lstrip().startswith("Polycarp likes squares"))
    assert len(problem["tests"]["inputs"]) > 100 and problem["time_limit_s"] == 1.0
    reward = CodeExecutionReward(limits=LIMITS, pool=pool)
    good = reward(f"```python\n{SQUARES_AND_CUBES}\n```", problem)
    assert good.reward == 1.0 and good.metrics["all_passed"] == 1.0, good.info["tests"][:3]
    off_by_one = SQUARES_AND_CUBES.replace("- iroot(n, 6)", "- iroot(n, 6) + (n > 5)")
    bad = reward(f"```python\n{off_by_one}\n```", problem)
    assert bad.reward == 0.0 and bad.metrics["pass_fraction"] < 1.0
    assert {t["verdict"] for t in bad.info["tests"]} <= {"passed", "wrong_answer"}


# -- assert grading ----------------------------------------------------------------------------

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def test_asserts_pass_fail_and_error(pool):
    report = run_assert_tests("def add(a, b):\n    return a + b", TESTS, limits=LIMITS, pool=pool)
    assert report.all_passed and [c.verdict for c in report.cases] == ["passed"] * 3
    report = run_assert_tests("def add(a, b):\n    return a + b + (a == 2)", TESTS, pool=pool)
    assert [c.verdict for c in report.cases] == ["passed", "passed", "wrong_answer"]
    assert report.cases[2].expected == TESTS[2] and report.cases[2].error == "AssertionError"
    report = run_assert_tests("def add(a, b):\n    return a / (a + b)", TESTS, pool=pool)
    assert [c.verdict for c in report.cases] == ["wrong_answer", "runtime_error", "wrong_answer"]
    assert "ZeroDivisionError" in report.cases[1].error


def test_asserts_setup_code_and_program_errors(pool):
    report = run_assert_tests("def f():\n    return math.pi", ["assert f() > 3"],
                              setup_code="import math", pool=pool)
    assert report.all_passed
    report = run_assert_tests("def add(a, b) return a", TESTS, pool=pool)
    assert [c.verdict for c in report.cases] == ["runtime_error"] * 3
    assert "SyntaxError" in report.program_error


def test_asserts_per_test_timeout_keeps_later_tests(pool):
    src = "def add(a, b):\n    while a < 0:\n        pass\n    return a + b"
    report = run_assert_tests(src, TESTS, limits=LIMITS, pool=pool, per_test_timeout_s=0.5)
    assert [c.verdict for c in report.cases] == ["passed", "timeout", "passed"]
    assert report.timeout_fraction == pytest.approx(1 / 3)


@pytest.mark.parametrize("cheat", [
    "import os\nos._exit(0)",
    "import sys\nsys.exit(0)",
    "print('passed')\nraise SystemExit",
    "import builtins\nbuiltins.AssertionError = None",
])
def test_early_exit_cannot_fake_a_pass(pool, cheat):
    report = run_assert_tests(f"def add(a, b):\n    return 0\n{cheat}", TESTS, pool=pool)
    assert report.n_passed < 3 and not report.all_passed


def test_asserts_killed_midway_reports_not_run(pool):
    src = "import os\ndef add(a, b):\n    if a < 0:\n        os._exit(0)\n    return a + b"
    report = run_assert_tests(src, TESTS, pool=pool)
    assert [c.verdict for c in report.cases] == ["passed", "runtime_error", "not_run"]


# -- the reward --------------------------------------------------------------------------------

def test_reward_metrics_and_info(pool):
    problem = {"test_list": TESTS, "test_setup_code": ""}
    reward = CodeExecutionReward(limits=LIMITS, pool=pool)
    assert reward.name == "code"
    none = reward("I can't write code today.", problem)
    assert none.reward == 0.0 and none.metrics == {
        "pass_fraction": 0.0, "all_passed": 0.0, "has_code": 0.0, "timeout_fraction": 0.0,
        "sandbox_error_fraction": 0.0}
    assert none.info["extract"] == "no_code_block"
    two_of_three = "```python\ndef add(a, b):\n    return a + b + (a == 2)\n```"
    res = reward(two_of_three, problem)
    assert res.reward == 0.0 and res.metrics["pass_fraction"] == pytest.approx(2 / 3)
    assert res.metrics["all_passed"] == 0.0 and res.metrics["has_code"] == 1.0
    assert [t["verdict"] for t in res.info["tests"]] == ["passed", "passed", "wrong_answer"]
    partial = CodeExecutionReward(partial_credit=True, limits=LIMITS, pool=pool)
    assert partial(two_of_three, problem).reward == pytest.approx(2 / 3)
    full = partial("```python\ndef add(a, b):\n    return a + b\n```", problem)
    assert full.reward == 1.0 and full.metrics["all_passed"] == 1.0
    slow = partial("```python\ndef add(a, b):\n    while True:\n        pass\n```", problem)
    assert slow.reward == 0.0 and slow.metrics["timeout_fraction"] > 0
    combined = WeightedSum([(1.0, reward)])(two_of_three, problem)
    assert combined.metrics["code/pass_fraction"] == pytest.approx(2 / 3)
    with pytest.raises(DataError):
        reward("```python\nprint(1)\n```", {"question": "no tests"})


def test_reward_owns_its_pool_when_none_given():
    reward = CodeExecutionReward(limits=LIMITS)
    problem = {"tests": {"inputs": ["2 3\n"], "outputs": ["5"]}}
    try:
        assert reward("```python\nprint(sum(map(int, input().split())))\n```", problem).reward == 1.0
    finally:
        reward.close()


# -- loaders -----------------------------------------------------------------------------------

def test_load_mbpp_files_splits_and_rows(tmp_path):
    full = load_mbpp(os.path.join(DATA, "mbpp", "mbpp.jsonl"))
    assert len(full) == 974 and "\r" not in full[0]["code"]
    assert set(full[0]) >= {"task_id", "prompt", "code", "test_list", "test_setup_code"}
    assert len(load_mbpp("test", data_dir=DATA)) == 500
    assert len(load_mbpp("train", data_dir=DATA)) == 374
    sanitized = load_mbpp("sanitized", data_dir=DATA)
    assert len(sanitized) == 427 and sanitized[0]["prompt"]
    with_imports = next(p for p in sanitized if p["test_setup_code"])
    assert with_imports["test_setup_code"].startswith("import")
    rows = [{"task_id": 1, "text": "t", "code": "c", "test_list": ["assert 1"],
             "test_setup_code": "", "challenge_test_list": []}]
    assert load_mbpp(rows)[0]["prompt"] == "t"  # e.g. a datasets.Dataset
    assert len(load_mbpp("test")) == 500  # a split name resolves against the data roots (the shipped copy at least)
    with pytest.raises(DataError):
        load_mbpp("test", data_dir=str(tmp_path))  # a data dir without mbpp/
    with pytest.raises(DataError):
        load_mbpp(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError):
        load_mbpp([{"task_id": 1}])


def test_load_codecontests_local_and_hf_rows():
    problems = load_codecontests(CC_FILE)
    assert len(problems) == 165
    assert sum(len(p["tests"]["inputs"]) for p in problems) == 1837
    assert all(p["time_limit_s"] and p["memory_limit_bytes"] for p in problems)
    hf_row = {"name": "x", "description": "Add.", "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
              "private_tests": {"input": ["2 2\n"], "output": ["4\n"]},
              "generated_tests": {"input": ["0 0\n"], "output": ["0\n"]},
              "time_limit": {"seconds": 2, "nanos": 500000000}, "memory_limit_bytes": 256 << 20}
    (p,) = load_codecontests([hf_row])
    assert p["tests"] == {"inputs": ["1 2\n", "2 2\n"], "outputs": ["3\n", "4\n"]}
    assert p["time_limit_s"] == 2.5 and p["name"] == "x"
    (g,) = load_codecontests([hf_row], include=("generated",))
    assert g["tests"]["inputs"] == ["0 0\n"]
    with pytest.raises(DataError):
        load_codecontests([{"tests": {}}])
    assert json.loads(json.dumps(p))  # plain JSON-able records
