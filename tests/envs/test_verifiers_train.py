"""`rlkit train recipe=verifiers_grpo_smoke` on verifiers environments a user wrote (tests/envs/vf_*.py),
swapped in by overriding ``train.task.env`` alone: single turn, multi-turn (the env's responses), with
a tool (verifiers' MCP server); episodes whose rubric raises are counted, not fatal. (Bad input: one
line each, test_verifiers.py; through `rlkit train`, exit 2: test_verifiers_site.py.) Needs verifiers
importable (see test_verifiers.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1", reason="the verifiers extra (dev: .venv/site-verifiers, run by test_verifiers_site.py)")

from rlkit import cli  # noqa: E402

pytestmark = pytest.mark.slow  # whole runs and subprocesses: outside the fast tier (-m 'not slow')
HERE = Path(__file__).parent


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def user_folder(monkeypatch):
    monkeypatch.chdir(HERE)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # the task exports its import path; restored after


@pytest.mark.parametrize("env, turns", [("vf_word:load_environment", 1.0), ("vf_guess:load_environment", None),
                                        ("vf_calc:load_environment", None)], ids=["single_turn", "multi_turn", "tools"])
def test_a_users_environment_trains_by_overriding_env_alone(tmp_path, env, turns):
    run = tmp_path / "run"
    assert cli.main(["train", "recipe=verifiers_grpo_smoke", f"train.task.env={env}", "train.eval.problems=0",
                     "logger.console=false", f"run_dir={run}"]) == 0
    steps = [m for m in metrics(run) if "reward/mean" in m]
    assert [m["step"] for m in steps] == [0, 1]
    assert all(m["tokens/sampled"] > 0 and m["rollout/failed"] == 0 and m["reward/agent/calls"] >= 1 for m in steps)
    assert all(any(k.startswith("reward/verifiers/") and k != "reward/verifiers/turns" for k in m) for m in steps)
    if turns is not None:
        assert all(m["reward/verifiers/turns"] == turns for m in steps)
    if env.startswith("vf_guess"):  # three guesses of 1..9 by a random model: almost always more than one turn
        assert max(m["reward/verifiers/turns"] for m in steps) > 1


def test_episodes_whose_rubric_raises_are_counted_and_the_run_finishes(tmp_path):
    run = tmp_path / "run"
    assert cli.main(["train", "recipe=verifiers_grpo_smoke", "train.task.env=vf_flaky:load_environment", "train.eval.problems=0",
                     "train.groups_per_batch=4", "train.rollout.max_failed_steps=0", "logger.console=false", f"run_dir={run}"]) == 0
    steps = [m for m in metrics(run) if "reward/mean" in m]
    assert len(steps) == 2 and sum(m["rollout/failed"] for m in steps) > 0 and sum(m["reward/agent/failed"] for m in steps) > 0
