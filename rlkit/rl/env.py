"""The RL data model: environments, transitions, trajectories.

An :class:`Env` is single-use: ``initial_observation()`` gives the prompt tokens, and each
``step(action_tokens)`` returns a :class:`StepResult` (reward, done, and the tokens the environment
appends before the next action — e.g. a rendered user turn and the assistant header). Multi-turn
is just more steps. Token ids flow through unchanged: the model's sampled tokens are kept exactly
as sampled, never decoded and re-encoded.

An :class:`EnvGroup` makes the G envs of one problem (GRPO's group) and may score the group
jointly (``score_group``), e.g. for pairwise or rank-based rewards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence

from rlkit.rewards.base import RewardResult, as_result


@dataclass
class StepResult:
    reward: float
    done: bool
    next_observation: List[int] = field(default_factory=list)
    metrics: Dict[str, float] = field(default_factory=dict)
    info: Dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    def initial_observation(self) -> List[int]: ...

    def step(self, action: List[int]) -> StepResult: ...


class EnvGroup(Protocol):
    problem: Mapping[str, Any]

    def make_envs(self, n: int) -> List[Env]: ...

    def score_group(self, trajectories: Sequence["Trajectory"]) -> Optional[List[float]]: ...


@dataclass
class Transition:
    """One turn: the observation tokens added before the action, the sampled action and its
    sampler logprobs, and what the environment returned."""

    observation: List[int]
    action: List[int]
    action_logprobs: List[float]
    reward: float = 0.0
    done: bool = False
    stop_reason: str = "stop"
    metrics: Dict[str, float] = field(default_factory=dict)
    info: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    transitions: List[Transition] = field(default_factory=list)
    failed: bool = False
    failure: str = ""
    sampler_version: int = 0

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.transitions))

    @property
    def tokens(self) -> List[int]:
        out: List[int] = []
        for t in self.transitions:
            out += t.observation + t.action
        return out

    @property
    def num_action_tokens(self) -> int:
        return sum(len(t.action) for t in self.transitions)

    @property
    def metrics(self) -> Dict[str, float]:
        merged: Dict[str, float] = {}
        for t in self.transitions:
            merged.update(t.metrics)
        return merged


@dataclass
class TrajectoryGroup:
    """The G trajectories of one problem, with the rewards used for advantages."""

    problem: Mapping[str, Any]
    trajectories: List[Trajectory]
    rewards: List[float]
    sampler_version: int = 0
    failed: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    reward_seconds: float = 0.0
    skipped: str = ""  # why the group could not be sampled at all (e.g. its prompt exceeds the context window)

    @property
    def has_variance(self) -> bool:
        return len(set(self.rewards)) > 1


RewardCallable = Callable[[str, Mapping[str, Any]], Any]


class SingleTurnEnv:
    """Prompt -> one completion -> ``reward_fn(decoded completion, problem)``."""

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


class SingleTurnEnvGroup:
    """G copies of a :class:`SingleTurnEnv` on one problem."""

    def __init__(self, prompt: List[int], problem: Mapping[str, Any], reward_fn: RewardCallable, tokenizer: Any):
        self.prompt, self.problem, self.reward_fn, self.tokenizer = prompt, problem, reward_fn, tokenizer

    def make_envs(self, n: int) -> List[SingleTurnEnv]:
        return [SingleTurnEnv(self.prompt, self.problem, self.reward_fn, self.tokenizer) for _ in range(n)]

    def score_group(self, trajectories: Sequence[Trajectory]) -> Optional[List[float]]:
        return None
