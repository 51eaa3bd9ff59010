"""Code benchmarks scored in rlkit's sandbox: lm-eval's own MBPP / HumanEval metric functions run
unchanged with HF ``evaluate``'s ``code_eval`` replaced by :class:`SandboxCodeEval`; right programs
pass, wrong ones fail, and nothing of the model's code runs in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # sandboxed subprocesses

LM_EVAL_TASKS = Path(__import__("lm_eval").__file__).parent / "tasks"


@pytest.fixture()
def no_in_process_exec(monkeypatch):
    """HF evaluate's code_eval cannot load, and this process cannot fork a program runner."""
    import multiprocessing

    import evaluate

    def refuse(*args, **kwargs):
        raise AssertionError("in-process code execution was attempted")

    monkeypatch.setattr(evaluate, "load", refuse)
    monkeypatch.setattr(multiprocessing.Process, "start", refuse)


def mbpp_items(n):
    from rlkit.data import SHIPPED_DATA

    rows = [json.loads(line) for line in (SHIPPED_DATA / "mbpp" / "mbpp.jsonl").read_text().splitlines()]
    return [r for r in rows if 11 <= r["task_id"] <= 510][:n]  # the hub's test split


def test_mbpp_metric_in_the_sandbox(no_in_process_exec, tmp_path):
    from rlkit.harness import code_exec

    utils = code_exec.load_task_module(LM_EVAL_TASKS / "mbpp" / "utils.py")  # its import-time self-check runs sandboxed
    items = mbpp_items(3)
    tests = ["\n".join(item["test_list"]) for item in items]
    right = [item["code"] for item in items]
    wrong = [item["code"] + "\n" + item["code"].split("def ", 1)[0] + "def " + item["code"].split("def ", 1)[1].split("(")[0] + "(*a): return None"
             for item in items]  # the same function redefined to return None
    before = code_exec.code_eval().programs_run
    assert [utils.pass_at_1([t], [p]) for t, p in zip(tests, right)] == [1.0, 1.0, 1.0]
    assert [utils.pass_at_1([t], [p]) for t, p in zip(tests, wrong)] == [0.0, 0.0, 0.0]
    assert code_exec.code_eval().programs_run - before == 6
    marker = tmp_path / "ran-here.txt"
    escape = f"open({str(marker)!r}, 'w').write('x')\nassert True"
    assert utils.pass_at_1(["assert True"], [escape]) == 0.0  # the host's files are out of reach ...
    assert not marker.exists()  # ... and the program did not run in this process


def test_pass_at_k_matches_code_eval_semantics(no_in_process_exec):
    from rlkit.harness import code_exec

    utils = code_exec.load_task_module(LM_EVAL_TASKS / "humaneval" / "utils.py")
    ok, bad = "def f(x): return x + 1", "def f(x): return x"
    crash = "import sys\nsys.exit(0)\ndef f(x): return x + 1"  # any exception, SystemExit included, fails
    result = utils.pass_at_k(["assert f(1) == 2"] * 2, [[ok, bad, crash], [bad, ok, ok]], k=[1, 2])
    assert result["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert result["pass@2"] == pytest.approx(((1 - 1 / 3) + 1.0) / 2)  # 1 - C(n-c, 2)/C(n, 2): 1 - 1/3 and 1
    slow = "def f(x):\n    while True: pass\nf(1)"
    scores, details = code_exec.code_eval().compute(predictions=[[slow]], references=["pass"], k=[1, 2], timeout=0.5)
    assert scores == {"pass@1": 0.0} and details[0][0][1]["result"] == "timed out"  # no pass@2 with one sample


def test_estimator():
    from rlkit.harness.code_exec import estimate_pass_at_k

    assert list(estimate_pass_at_k([10, 10, 5], [0, 10, 2], 1)) == pytest.approx([0.0, 1.0, 0.4])
    assert estimate_pass_at_k([5], [2], 5)[0] == 1.0  # n - c < k
