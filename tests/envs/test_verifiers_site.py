"""verifiers with its own pins, beside .venv: the dev install keeps the envs extra (openenv, textarena,
openai 3.x) in .venv and puts verifiers 0.4.0 with what it pins differently (openai 2.x, mcp 2.0) in
.venv/site-verifiers (scripts/install_verifiers.sh: the two cannot share one environment). These tests
run, in a child with that folder first on PYTHONPATH: rlkit's verifiers tests (test_verifiers*.py skip
where verifiers is not importable), and rlkit's own openai-using code on openai 2.x (the LLM judge, the
rollout endpoint driven by the openai client) — the rest of the suite runs it on .venv's openai 3.x.
Without verifiers, the task says how to install it in one line."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses: outside the fast tier (-m 'not slow')
ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / ".venv" / "site-verifiers"
HERE = Path(__file__).parent


def in_site(*args, timeout=600):
    if not (SITE / "verifiers").is_dir():
        pytest.skip(f"no {SITE.relative_to(ROOT)}: bash scripts/install.sh dev (or scripts/install_verifiers.sh) builds it")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_verifiers_tests_and_rlkits_openai_code_pass_with_verifiers_own_pins():
    if importlib.util.find_spec("verifiers") is not None:
        pytest.skip("verifiers is importable here: test_verifiers*.py run in this process")
    proc = in_site("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(HERE / "test_verifiers.py"),
                   str(HERE / "test_verifiers_train.py"), str(ROOT / "tests/rewards/test_judge_reward.py"),
                   str(ROOT / "tests/rl/test_agent_endpoint.py") + "::test_endpoint_records_exact_tokens_with_the_runs_settings")
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail  # the openai 2.x check in test_verifiers.py ran too


def test_without_verifiers_the_run_stops_with_how_to_install_it(tmp_path):
    if importlib.util.find_spec("verifiers") is not None:
        pytest.skip("verifiers is installed here")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlkit", "train", "recipe=verifiers_grpo_smoke", f"run_dir={run}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "needs the verifiers package (verifiers==0.4.0): install the verifiers extra: pip install 'rlkit[verifiers]'" in lines[0]
    assert not run.exists()
