"""MBPP end to end: every reference solution passes its own tests in the sandbox; wrong ones fail.

All 974 problems of ``mbpp.jsonl`` run (about 25-45 s on 2 cores with a pool of 2).
"""

from __future__ import annotations

import ast
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlkit.data import SHIPPED_DATA
from rlkit.rewards.code import CodeExecutionReward, run_assert_tests
from rlkit.rewards.code_data import load_mbpp
from rlkit.sandbox import SandboxLimits, SandboxPool

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

DATA = str(SHIPPED_DATA)  # the byte-identical copies the package ships
# generous per-test budget: a few references are slow (task 123 needs ~2.6 s of CPU)
LIMITS = SandboxLimits(cpu_time_s=10, wall_time_s=20)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(2, limits=LIMITS) as p:
        yield p


def grade_all(problems, sources, pool):
    def one(args):
        problem, source = args
        return run_assert_tests(source, problem["test_list"], problem["test_setup_code"],
                                limits=LIMITS, pool=pool)

    with ThreadPoolExecutor(8) as ex:  # keeps the sandbox pool busy; the pool bounds processes
        return list(ex.map(one, zip(problems, sources)))


def test_all_reference_solutions_pass(pool):
    problems = load_mbpp(os.path.join(DATA, "mbpp", "mbpp.jsonl"))
    assert len(problems) == 974
    reports = grade_all(problems, [p["code"] for p in problems], pool)
    failed = {p["task_id"]: r.to_dict()["tests"] for p, r in zip(problems, reports) if not r.all_passed}
    assert not failed, f"{len(failed)} reference solutions failed: {dict(list(failed.items())[:3])}"


def test_sanitized_reference_solutions_pass(pool):
    problems = load_mbpp(os.path.join(DATA, "mbpp", "sanitized-mbpp.json"))[::4]  # 107 of 427
    reports = grade_all(problems, [p["code"] for p in problems], pool)
    assert [p["task_id"] for p, r in zip(problems, reports) if not r.all_passed] == []


PERTURB = """

class _Wrong:
    def __eq__(self, other): return False
    def __ne__(self, other): return True
    def __bool__(self): raise TypeError("wrong answer")
    def __iter__(self): raise TypeError("wrong answer")
    def __float__(self): raise TypeError("wrong answer")
    __hash__ = object.__hash__
"""


def perturbed(code: str) -> str:
    """The reference with every top-level function's return value replaced by a wrong one."""
    names = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    wraps = "".join(f"{n} = (lambda f: lambda *a, **k: (f(*a, **k), _Wrong())[1])({n})\n"
                    for n in names)
    return code + PERTURB + wraps


def test_wrong_solutions_fail(pool):
    problems = load_mbpp(os.path.join(DATA, "mbpp", "mbpp.jsonl"))[::10]  # 98 problems
    problems = [p for p in problems if any(isinstance(n, ast.FunctionDef)
                                           for n in ast.parse(p["code"]).body)]
    assert len(problems) > 90
    reports = grade_all(problems, [perturbed(p["code"]) for p in problems], pool)
    assert [p["task_id"] for p, r in zip(problems, reports) if r.n_passed] == []


def test_reward_on_mbpp_problems(pool):
    problems = load_mbpp("test", data_dir=DATA)[:20]
    reward = CodeExecutionReward(limits=LIMITS, pool=pool)
    for problem in problems:
        right = reward(f"Sure:\n```python\n{problem['code']}\n```", problem)
        assert right.reward == 1.0, (problem["task_id"], right.info)
        name = next(n.name for n in ast.parse(problem["code"]).body
                    if isinstance(n, ast.FunctionDef))
        stub = reward(f"```python\ndef {name}(*args):\n    return None\n```", problem)
        assert stub.reward == 0.0 and stub.metrics["has_code"] == 1.0, problem["task_id"]
