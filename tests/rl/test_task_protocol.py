"""The declared task protocol: required members, safe defaults, the registry, hooks the loops call
unconditionally (EnvGroup.close, score_group, Task.close on every exit path), and a user task in
its own file (cookbook/custom_task) run through the CLI."""

import json
import os
from pathlib import Path

import pytest
import warm_rlkit

from rlkit import cli
from rlkit.errors import ConfigError
from rlkit.tasks import EnvGroup, SingleTurnEnvGroup, Task, TASKS, build_task, register_task
from rlkit.tasks.base import StepResult
from rlkit.types import SamplingParams

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ROOT = Path(__file__).resolve().parents[2]
COOKBOOK = ROOT / "cookbook" / "custom_task"
CLOSED = []  # names of tasks whose close() ran (ClosingTask below)


class Minimal(Task):
    def problems(self, split):
        return [{"q": "x"}]

    def env_group(self, problem, tokenizer):
        return SingleTurnEnvGroup([1, 2], problem, lambda c, p: 0.0, tokenizer)


def test_a_task_needs_only_problems_and_env_group_and_the_rest_defaults_safely():
    task = Minimal()
    problem = task.problems("train")[0]
    assert task.prompt(problem, None) is None and task.messages(problem) is None
    assert task.reference_completion(problem) is None and not task.has_references
    task.close()  # does nothing, never fails
    with pytest.raises(ConfigError, match="has no reward"):
        task.reward("1", problem)

    class WithReferences(Minimal):
        def reference_completion(self, problem):
            return " 1"

    assert WithReferences().has_references
    with pytest.raises(TypeError):  # the two required members are abstract
        type("Incomplete", (Task,), {"problems": lambda self, split: []})()


def test_build_task_refuses_what_is_not_a_task_and_registers_names():
    with pytest.raises(ConfigError, match="not a rlkit.tasks.Task subclass"):
        build_task({"_target_": "collections.OrderedDict"})
    with pytest.raises(ConfigError, match="unknown task"):
        build_task({"name": "no_such_task"})
    register_task("minimal_test_task", Minimal)
    try:
        assert isinstance(build_task({"name": "minimal_test_task"}), Minimal)
        with pytest.raises(ConfigError, match="not a rlkit.tasks.Task subclass"):
            register_task("bad", dict)
    finally:
        TASKS.pop("minimal_test_task")


class CountingGroup(EnvGroup):
    closed = 0

    def __init__(self, inner):
        self.inner, self.problem = inner, inner.problem

    def make_envs(self, n):
        return self.inner.make_envs(n)

    def close(self):
        CountingGroup.closed += 1


def test_collectors_close_every_group_and_use_the_default_score(service):
    from rlkit.rl.collect import RolloutPolicy, collect_groups

    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    try:
        sampler = trainer.save_weights_and_get_sampling_client()
        tok = trainer.get_tokenizer()
        groups = [CountingGroup(SingleTurnEnvGroup(tok.encode(f"say {i}"), {"i": i}, lambda c, p: float(len(c) % 2), tok)) for i in range(3)]
        got = collect_groups(sampler, groups, 2, SamplingParams(max_tokens=3, temperature=1.0, seed=1), RolloutPolicy(), concurrency=2)
    finally:
        trainer.stop()
    assert CountingGroup.closed == 3
    assert all(g.rewards == [t.total_reward for t in g.trajectories] for g in got)  # score_group default: per trajectory


class ClosingTask(Minimal):
    """Records close(); with explode=True its env groups raise (a loop failure mid-run)."""

    name = "closing"

    def __init__(self, num_train=8, num_test=2, explode=False):
        self.explode = explode

    def problems(self, split):
        return [{"q": f"{split} {i}"} for i in range(4)]

    def env_group(self, problem, tokenizer):
        if self.explode:
            raise RuntimeError("env exploded (test)")
        return SingleTurnEnvGroup(tokenizer.encode(problem["q"]), problem, lambda c, p: float(len(c) % 2), tokenizer)

    def close(self):
        CLOSED.append(self.explode)


@pytest.mark.parametrize("explode", [False, True])
def test_every_loop_exit_path_closes_the_task(tmp_path, monkeypatch, explode):
    monkeypatch.chdir(tmp_path)
    CLOSED.clear()
    overrides = ["recipe=arithmetic_grpo_smoke", "+train.task._target_=test_task_protocol.ClosingTask", "~train.task.name",
                 "~train.task.ops", "~train.task.num_shots", f"+train.task.explode={explode}", "train.steps=1", "train.eval.problems=0"]
    cfg = cli.compose(overrides)
    if explode:
        with pytest.raises(RuntimeError, match="env exploded"):
            cli.execute(cfg, tmp_path / "run", overrides)
    else:
        cli.execute(cfg, tmp_path / "run", overrides)
    assert CLOSED == [explode]


def _train(args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(COOKBOOK), os.environ.get("PYTHONPATH", "")])}
    return warm_rlkit.run(["train", *args], cwd=cwd, env=env, timeout=300)


def test_cookbook_task_runs_rl_and_its_sft_baseline_from_the_cli(tmp_path):
    task = ["+train.task._target_=letter_count.LetterCountTask", "~train.task.name", "~train.task.ops", "~train.task.num_shots",
            "train.steps=1", "train.eval.problems=2", "train.eval.pass_k=0"]
    for loop, run_dir in (([], "rl"), (["loop=task_sft"], "sft")):
        proc = _train(["recipe=arithmetic_grpo_smoke", *loop, *task, f"run_dir={run_dir}"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        metrics = [json.loads(x) for x in (tmp_path / run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [0, 1] and "eval/greedy_accuracy" in metrics[-1]
        assert ("reward/mean" in metrics[0]) == (not loop) and ("train/nll" in metrics[0]) == bool(loop)
    proc = _train(["recipe=arithmetic_grpo_smoke", "+train.task._target_=collections.OrderedDict", "~train.task.name", "~train.task.ops",
                   "~train.task.num_shots", "run_dir=bad"], tmp_path)
    assert proc.returncode == 2 and "not a rlkit.tasks.Task subclass" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "bad").exists()


def test_env_protocol_is_declared():
    assert StepResult(reward=1.0, done=True).next_observation == []
    from rlkit.rl import env as rl_env  # the old import path still works

    assert rl_env.EnvGroup is EnvGroup
