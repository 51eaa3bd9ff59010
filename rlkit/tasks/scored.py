"""``task.name=scored``: any single-turn task, its completions scored by another reward — an LLM
judge (:class:`rlkit.rewards.judge.JudgeReward`), a reward model
(:class:`rlkit.rewards.reward_model.RewardModel`) or any ``_target_`` reward callable::

    train:
      task:
        name: scored
        task: {name: gsm8k, num_train: 40}          # problems and prompts (its prompt(), reward())
        reward: {_target_: rlkit.rewards.judge:JudgeReward, base_url: "http://127.0.0.1:8000/v1", model: judge}
        weight: 1.0                                  # r = weight * reward + task_weight * the task's own reward
        task_weight: 0.0

A reward with ``score_batch(completions, problems)`` (the reward model) scores a whole GRPO group
in one call, from :meth:`ScoredEnvGroup.score_group`; others score each completion as its env
steps. A reward that raises (a judge that fails or answers unparseably) fails that rollout under
``train.rollout.on_failure`` — counted in ``rollout/failed``, the run goes on — and what the error
carries (``judge/failed``, tokens spent) is kept on the failed turn's metrics.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from rlkit.errors import ConfigError
from rlkit.rewards.base import RewardResult, as_result
from rlkit.tasks.base import Env, EnvGroup, StepResult, Task, Trajectory, build_task


def build_reward(spec: Any, where: str = "task.reward") -> Any:
    """A reward callable from ``{_target_: "module:Class", **options}`` (or the callable itself)."""
    if callable(spec):
        return spec
    if not isinstance(spec, Mapping) or not spec.get("_target_"):
        raise ConfigError(f"{where}: give {{_target_: module:Class, ...options}} (e.g. rlkit.rewards.judge:JudgeReward)")
    from rlkit.imports import check_kwargs, import_object

    options = dict(spec)
    target = import_object(options.pop("_target_"), f"{where}._target_")
    try:
        return target(**check_kwargs(target, options, where))
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


class ScoredEnv(Env):
    def __init__(self, group: "ScoredEnvGroup"):
        self.group = group
        self.completion = ""
        self.failure_metrics: Dict[str, float] = {}

    def initial_observation(self) -> List[int]:
        return list(self.group.prompt)

    def step(self, action: List[int]) -> StepResult:
        g = self.group
        self.completion = g.tokenizer.decode(action, skip_special_tokens=True)
        metrics: Dict[str, float] = {}
        reward = 0.0
        if g.task_weight:
            own = as_result(g.task.reward(self.completion, g.problem))
            reward += g.task_weight * own.reward
            metrics.update(own.metrics)
        if not g.batched:
            try:
                scored = as_result(g.reward(self.completion, g.problem))
            except Exception as exc:
                self.failure_metrics = {**metrics, **getattr(exc, "metrics", {})}
                raise
            reward += g.weight * scored.reward
            metrics.update(scored.metrics)
        return StepResult(reward=reward, done=True, metrics=metrics, info={"completion": self.completion})


class ScoredEnvGroup(EnvGroup):
    def __init__(self, task: Task, problem: Mapping[str, Any], tokenizer: Any, reward: Any, weight: float, task_weight: float):
        self.task, self.problem, self.tokenizer, self.reward = task, problem, tokenizer, reward
        self.weight, self.task_weight = weight, task_weight
        self.batched = callable(getattr(reward, "score_batch", None))
        self.prompt = task.prompt(problem, tokenizer)
        if self.prompt is None:
            raise ConfigError(f"task.name=scored: the inner task {task.name!r} has no prompt(); wrap a single-turn task")
        self.envs: List[ScoredEnv] = []

    def make_envs(self, n: int) -> List[ScoredEnv]:
        self.envs = [ScoredEnv(self) for _ in range(n)]
        return list(self.envs)

    def score_group(self, trajectories: Sequence[Trajectory]) -> Optional[List[float]]:
        for env, traj in zip(self.envs, trajectories):  # keep what a failed reward cost (tokens) on its turn
            if traj.failed and env.failure_metrics and traj.transitions:
                traj.transitions[-1].metrics.update(env.failure_metrics)
        if not self.batched:
            return None
        live = [(i, env) for i, (env, t) in enumerate(zip(self.envs, trajectories)) if not t.failed]
        results: List[RewardResult] = list(self.reward.score_batch([e.completion for _, e in live], [self.problem] * len(live)))
        rewards = [t.total_reward for t in trajectories]
        for (i, _), result in zip(live, results):
            rewards[i] += self.weight * float(result.reward)
            if trajectories[i].transitions:
                trajectories[i].transitions[-1].metrics.update(result.metrics)
        return rewards


class ScoredTask(Task):
    """The inner task's problems and prompts; the rewards of ``reward`` (see the module docstring)."""

    name = "scored"

    def __init__(self, task: Optional[Dict[str, Any]] = None, reward: Any = None, weight: float = 1.0, task_weight: float = 0.0):
        if not task:
            raise ConfigError("task.task: the task whose problems are scored (e.g. {name: gsm8k})")
        if reward is None:
            raise ConfigError("task.reward: the reward that scores them ({_target_: rlkit.rewards.judge:JudgeReward, ...})")
        self.inner = build_task(task, "task.task")
        self.scorer = build_reward(reward)
        self.weight, self.task_weight = float(weight), float(task_weight)

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return self.inner.problems(split)

    def prompt(self, problem: Mapping[str, Any], tokenizer: Any) -> Optional[List[int]]:
        return self.inner.prompt(problem, tokenizer)

    def messages(self, problem: Mapping[str, Any]) -> Any:
        return self.inner.messages(problem)

    def reward(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        result = as_result(self.scorer(completion, problem))
        if self.task_weight:
            own = as_result(self.inner.reward(completion, problem))
            return RewardResult(self.weight * result.reward + self.task_weight * own.reward, {**own.metrics, **result.metrics})
        return RewardResult(self.weight * result.reward, result.metrics, result.info)

    def reference_completion(self, problem: Mapping[str, Any]) -> Optional[str]:
        return self.inner.reference_completion(problem)

    @property
    def has_references(self) -> bool:
        return self.inner.has_references

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> ScoredEnvGroup:
        return ScoredEnvGroup(self.inner, problem, tokenizer, self.scorer, self.weight, self.task_weight)

    def close(self) -> None:
        self.inner.close()
