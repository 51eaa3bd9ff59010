"""The declared task protocol and the RL data model it produces (DESIGN §4).

A :class:`Task` supplies problems and turns each into an :class:`EnvGroup`, the G environments of
one problem (GRPO's group). An :class:`Env` is single-use: ``initial_observation()`` gives the
prompt tokens, and each ``step(action_tokens)`` returns a :class:`StepResult` (reward, done, and
the tokens the environment appends before the next action — e.g. a rendered user turn and the
assistant header). Multi-turn is just more steps. Token ids flow through unchanged: the model's
sampled tokens are kept exactly as sampled, never decoded and re-encoded. The collector
(:mod:`rlkit.rl.collect`) records each turn as a :class:`Transition` of a :class:`Trajectory`.

An environment that must *change* earlier context (e.g. drop reasoning blocks from the history, on
request) returns ``next_context`` instead: the whole context of the next turn. The trajectory then
holds several token sequences (:attr:`Trajectory.sequences`), each action trained in the context it
was sampled in, so the trained tokens are always the sampled tokens.

Every member a loop calls is declared here with a safe default, so loops call them
unconditionally (no ``hasattr`` probes): a task must implement :meth:`Task.problems` and
:meth:`Task.env_group`; everything else is optional. This module imports nothing from
``rlkit.rl``: tasks sit below the loops that run them.

Writing a task in your own package (``train.task._target_=my_pkg.tasks.MyTask``) is one class:
see ``cookbook/custom_task/``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

from rlkit.errors import ConfigError

Problem = Mapping[str, Any]
Messages = List[Dict[str, str]]


# -- environments ------------------------------------------------------------------------------------


@dataclass
class StepResult:
    """What an environment returns after one action."""

    reward: float
    done: bool
    next_observation: List[int] = field(default_factory=list)  # tokens appended before the next action
    metrics: Dict[str, float] = field(default_factory=dict)
    info: Dict[str, Any] = field(default_factory=dict)
    next_context: Optional[List[int]] = None  # replaces the whole context (a new sequence) instead of appending


class Env(abc.ABC):
    """One single-use environment: a prompt, then one :class:`StepResult` per sampled action."""

    @abc.abstractmethod
    def initial_observation(self) -> List[int]:
        """The prompt tokens."""

    @abc.abstractmethod
    def step(self, action: List[int]) -> StepResult:
        """Consume the sampled ``action`` tokens (exactly as sampled)."""


class EnvGroup(abc.ABC):
    """The G environments of one problem, optionally scored jointly."""

    problem: Problem

    @abc.abstractmethod
    def make_envs(self, n: int) -> List[Env]:
        """``n`` fresh environments on :attr:`problem`."""

    def score_group(self, trajectories: Sequence["Trajectory"]) -> Optional[List[float]]:
        """Rewards for the whole group (pairwise, rank-based, ...), or ``None`` (the default): each
        trajectory's own summed step rewards."""
        return None

    def rollout(self, sampling_client: Any, group_size: int, params: Any, policy: Any, *, sampler_version: int = 0,
                seed: Optional[int] = None) -> Optional["TrajectoryGroup"]:
        """A group that samples itself (an agent calling rlkit's rollout endpoint, ``rlkit.rl.agents``)
        returns its finished :class:`TrajectoryGroup`, failure policy applied; the default ``None``:
        the collector samples and steps :meth:`make_envs`'s envs."""
        return None

    def use_policy(self, sampling_client: Any, params: Any) -> None:
        """The collector hands the group the sampling client and params its episodes are sampled
        with, before :meth:`make_envs`: a group whose environment also lets the policy act in
        another seat (self-play, :mod:`rlkit.tasks.envs.textarena_task`) keeps them (default: nothing)."""

    def close(self) -> None:
        """Release what the group holds once its rollouts are scored (default: nothing)."""


# -- what rollouts produce -----------------------------------------------------------------------------


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
    new_sequence: bool = False  # the observation is a whole new context (the env returned next_context)


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
        """All tokens, sequence after sequence (one sequence unless an env returned ``next_context``)."""
        return [tok for seq in self.sequences for tok in seq]

    @property
    def sequences(self) -> List[List[int]]:
        """The token sequences the sampler saw: ``ob_0 + ac_0 + ob_1 + ...``, a new one at each ``new_sequence``."""
        out: List[List[int]] = []
        for t in self.transitions:
            if t.new_sequence or not out:
                out.append([])
            out[-1] += t.observation + t.action
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

    problem: Problem
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


# -- tasks -------------------------------------------------------------------------------------------


class Task(abc.ABC):
    """Problems, their environments, and what the loops may ask of them.

    Required: :meth:`problems` and :meth:`env_group`. Optional, with safe defaults:
    :meth:`prompt` / :meth:`messages` (the first turn: what ``task_sft`` trains after and a
    teacher re-renders),
    :meth:`reward` (grading a final answer outside an env: distillation, teacher accuracy),
    :meth:`reference_completion` (the SFT baseline; :attr:`has_references` follows from it) and
    :meth:`close`.
    """

    name: ClassVar[str] = "task"

    @abc.abstractmethod
    def problems(self, split: str) -> List[Dict[str, Any]]:
        """The problems of ``split`` ("train", "test"); raise ConfigError for an unknown split."""

    @abc.abstractmethod
    def env_group(self, problem: Problem, tokenizer: Any) -> EnvGroup:
        """The environments of one problem."""

    def prompt(self, problem: Problem, tokenizer: Any) -> Optional[List[int]]:
        """The first turn's prompt tokens — what the SFT baseline trains after and a teacher
        re-renders (default ``None``: the task has no fixed prompt)."""
        return None

    def messages(self, problem: Problem) -> Optional[Messages]:
        """The chat messages the prompt renders (default ``None``: not a chat rendering)."""
        return None

    def reward(self, completion: str, problem: Problem) -> Any:
        """Grade a decoded final answer: a float or a :class:`~rlkit.rewards.base.RewardResult`."""
        raise ConfigError(f"task {self.name!r} has no reward(completion, problem); this loop needs one")

    def reference_completion(self, problem: Problem) -> Optional[str]:
        """A correct completion after the prompt, for the SFT baseline (default ``None``)."""
        return None

    def reference_tokens(self, problem: Problem, tokenizer: Any) -> Optional[Tuple[List[int], List[float]]]:
        """A whole multi-turn demonstration as ``(tokens, loss weights)`` for the SFT baseline (e.g.
        tool calls, their results and the answer); default ``None``: ``task_sft`` trains on
        :meth:`prompt` + :meth:`reference_completion`."""
        return None

    def tool_demonstration(self, problem: Problem) -> Optional[Dict[str, Any]]:
        """How a solver with tools answers ``problem``: ``{"calls": [{"name", "arguments"}], "answer":
        str}`` — the SFT warm start of :class:`rlkit.tasks.tools.ToolTask` (default ``None``: none)."""
        return None

    @property
    def has_references(self) -> bool:
        """Whether :meth:`reference_completion` gives answers: true when a subclass implements it."""
        return type(self).reference_completion is not Task.reference_completion

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Check the task's options before anything runs — no model loaded, no run directory
        written (``rlkit train``'s config check calls it with the coerced ``__init__`` keywords):
        an environment that does not exist, a server that is not one. Raise :class:`ConfigError`
        with one line naming the thing and the fix (default: nothing to check)."""

    def attach(self, service: Any, base_model: str) -> None:
        """Called by the RL loop once its training session is open: a task whose environment samples
        from a model of its own (a fixed opponent: the base model, a frozen checkpoint) makes its
        sampling client here from ``service`` (default: nothing)."""

    def close(self) -> None:
        """Release sandboxes, pools, files (default: nothing). Loops always call it."""


def split_problems(task: str, splits: Mapping[str, Sequence[Dict[str, Any]]], split: str) -> List[Dict[str, Any]]:
    """A :meth:`Task.problems` over fixed splits: a copy of ``splits[split]``, or one ConfigError
    line naming the splits there are (the split is a config value)."""
    if split not in splits:
        raise ConfigError(f"{task} task has splits {sorted(splits)}, not {split!r}")
    return list(splits[split])


def few_shot_messages(
    problem: Problem, shots: Sequence[Problem], question: Callable[[Problem], str], answer: Callable[[Problem], str],
    system: str = "",
) -> Messages:
    """A :meth:`Task.messages` with solved examples: the ``system`` turn (if any), each shot as a user
    turn (``question(shot)``) and its assistant answer (``answer(shot)``), then ``question(problem)``."""
    turns: Messages = [{"role": "system", "content": system}] if system else []
    for shot in shots:
        turns.append({"role": "user", "content": question(shot)})
        turns.append({"role": "assistant", "content": answer(shot)})
    turns.append({"role": "user", "content": question(problem)})
    return turns


#: built-in task name -> "module:Class" (imported when used)
TASKS: Dict[str, Any] = {
    "arithmetic": "rlkit.tasks.arithmetic:ArithmeticTask",
    "gsm8k": "rlkit.tasks.gsm8k:GSM8KTask",
    "code": "rlkit.tasks.code:CodeTask",
    "tools": "rlkit.tasks.tools:ToolTask",
    "reasoning_gym": "rlkit.tasks.reasoning_gym:ReasoningGymTask",
    "scored": "rlkit.tasks.scored:ScoredTask",
    "agent": "rlkit.rl.agents:AgentTask",  # an OpenAI-client agent through rlkit.serve.rollouts
    "openenv": "rlkit.tasks.envs.openenv_task:OpenEnvTask",  # the envs extra
    "textarena": "rlkit.tasks.envs.textarena_task:TextArenaTask",  # the envs extra
    "verifiers": "rlkit.rl.verifiers_agent:VerifiersTask",  # the verifiers extra (episodes through rlkit.serve.rollouts)
}


def register_task(name: str, cls: Any) -> None:
    """Make ``train.task.name=<name>`` build ``cls`` (a :class:`Task` subclass or ``"module:Class"``)."""
    if not isinstance(cls, str) and not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"register_task({name!r}, {cls!r}): not a rlkit.tasks.Task subclass")
    TASKS[name] = cls


def resolve_task(spec: Mapping[str, Any], where: str = "task") -> Tuple[type, Dict[str, Any]]:
    """The task class ``{name | _target_, **options}`` names and its options, checked against its
    ``__init__`` chain and coerced (:func:`rlkit.imports.check_kwargs`); nothing is built."""
    from rlkit.imports import check_kwargs, lookup

    spec = dict(spec)
    target = spec.get("_target_") or spec.get("name")
    cls = lookup(spec, TASKS, where, "task")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"task {target!r}: {cls!r} is not a rlkit.tasks.Task subclass (subclass it; see rlkit/tasks/base.py)")
    kwargs = check_kwargs(cls, spec, where)
    cls.check_options(kwargs)
    return cls, kwargs


def build_task(spec: Mapping[str, Any], where: str = "task") -> Task:
    """A task from ``{name | _target_, **options}``."""
    cls, kwargs = resolve_task(spec, where)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
