"""The single-turn environment: prompt -> one completion -> ``reward_fn(decoded completion, problem)``."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping

from rlkit.rewards.base import RewardResult, as_result
from rlkit.tasks.base import Env, EnvGroup, StepResult

RewardCallable = Callable[[str, Mapping[str, Any]], Any]


class SingleTurnEnv(Env):
    """One completion of ``prompt``, graded by ``reward_fn``."""

    def __init__(self, prompt: List[int], problem: Mapping[str, Any], reward_fn: RewardCallable, tokenizer: Any):
        self.prompt = list(prompt)
        self.problem = problem
        self.reward_fn = reward_fn
        self.tokenizer = tokenizer

    def initial_observation(self) -> List[int]:
        return list(self.prompt)

    def step(self, action: List[int]) -> StepResult:
        text = self.tokenizer.decode(action, skip_special_tokens=True)
        result: RewardResult = as_result(self.reward_fn(text, self.problem))
        return StepResult(reward=float(result.reward), done=True, metrics=dict(result.metrics), info={"completion": text, **result.info})


class SingleTurnEnvGroup(EnvGroup):
    """G copies of a :class:`SingleTurnEnv` on one problem."""

    def __init__(self, prompt: List[int], problem: Mapping[str, Any], reward_fn: RewardCallable, tokenizer: Any):
        self.prompt, self.problem, self.reward_fn, self.tokenizer = prompt, problem, reward_fn, tokenizer

    def make_envs(self, n: int) -> List[SingleTurnEnv]:
        return [SingleTurnEnv(self.prompt, self.problem, self.reward_fn, self.tokenizer) for _ in range(n)]
