"""Text environments from elsewhere as rlkit tasks: the one interface every adapter implements.

An environment of the field (an OpenEnv ``Environment``, a TextArena game, a verifiers environment,
a Gymnasium-style text env) speaks *text*: it shows an observation, takes the model's reply, and
answers with a reward, whether it is done, and the next observation. rlkit's RL loop speaks
*tokens* (:class:`rlkit.tasks.base.Env`: token ids flow through unchanged). This module is the
bridge, written once:

- :class:`TextEnv` — what an adapter implements: ``reset() -> TextTurn`` (the first observation)
  and ``step(reply) -> TextTurn``, plus ``close()``. One instance is one episode.
- :class:`ChatEnv` — a :class:`TextEnv` as an rlkit :class:`~rlkit.tasks.base.Env`: the first
  observation becomes the conversation ``[system?, user: observation]`` rendered with the model's
  own chat template (the assistant header opened); each sampled reply is decoded for the env, and
  the env's next observation is appended as the *tokens that follow the sampled ones* (the rest of
  the assistant turn, the user turn, the next assistant header:
  :meth:`rlkit.tools.ToolRenderer.continuation`). So a multi-turn episode trains as one token
  sequence with the model's sampled tokens exactly as sampled, and only the assistant turns
  trained (per-turn masks come from the collector's transitions). A :class:`TextTurn` with
  ``fresh=True`` (an env whose observation is the whole state, e.g. a TextArena board with its
  history) starts a new context ``[system?, user: observation]`` instead (a new sequence; each turn
  is trained in the context it was sampled in).
- :class:`TextEnvTask` — the :class:`~rlkit.tasks.base.Task` around an adapter: problems are
  ``{"seed": s}`` episodes (train and test seeds disjoint), every env of a group (GRPO's G) on the
  same seed; :meth:`TextEnvTask.make_env` is the adapter's one method.
- :class:`ChatPolicy` — the policy as a text player, for environments where the model also acts
  in another seat (self-play): ``reply(messages) -> str`` samples from the sampling client the
  collector hands the group (:meth:`rlkit.tasks.base.EnvGroup.use_policy`).

Failures stay in their episode: a ``reset`` that raises or hangs past ``reset_timeout_s``, a
``step`` that raises or hangs past ``train.rollout.timeout_s``, a malformed observation (not text)
or a non-finite reward fail that episode only; the collector counts it (``rollout/failed``) under
``train.rollout.on_failure``.
"""

from __future__ import annotations

import abc
import concurrent.futures
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rlkit.errors import ConfigError, DataError
from rlkit.tasks.base import Env, EnvGroup, Messages, Problem, StepResult, Task, split_problems

RESET_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="rlkit-env-reset")


@dataclass
class TextTurn:
    """What a text environment answers: its next ``observation`` (a user message; ignored once
    ``done``), the ``reward`` of the reply just taken, and whether the episode is ``done``."""

    observation: str = ""
    reward: float = 0.0
    done: bool = False
    metrics: Dict[str, float] = field(default_factory=dict)
    info: Dict[str, Any] = field(default_factory=dict)
    fresh: bool = False  # the observation is the whole state: the next context is [system?, user: observation] alone


class TextEnv(abc.ABC):
    """One episode of a text environment (single use). ``reset`` gives the first observation;
    ``step(reply)`` takes the model's decoded reply."""

    @abc.abstractmethod
    def reset(self) -> TextTurn:
        """The first observation (``reward`` and ``done`` are ignored)."""

    @abc.abstractmethod
    def step(self, reply: str) -> TextTurn:
        """Take the model's reply; the reward, done, and the next observation."""

    def close(self) -> None:
        """Release what the episode holds (a WebSocket session, a game); default: nothing."""


def check_turn(turn: Any, where: str) -> TextTurn:
    """``turn`` if it is a well-formed :class:`TextTurn` (text observation, finite reward), else a
    :class:`DataError` naming what is wrong (the episode fails, not the run)."""
    if not isinstance(turn, TextTurn):
        raise DataError(f"{where} returned {type(turn).__name__}, not a TextTurn")
    if not isinstance(turn.observation, str):
        raise DataError(f"{where}: the observation is {type(turn.observation).__name__}, not text")
    if not isinstance(turn.reward, (int, float)) or not math.isfinite(turn.reward):
        raise DataError(f"{where}: the reward is {turn.reward!r}, not a finite number")
    return turn


class ChatPolicy:
    """The policy as a text player: ``reply(messages)`` renders ``messages`` with the chat template,
    samples one reply from ``sampling_client`` with ``params`` and decodes it."""

    def __init__(self, sampling_client: Any, tokenizer: Any, params: Any):
        from rlkit.tools.render import ToolRenderer

        self.sampling_client, self.tokenizer, self.params = sampling_client, tokenizer, params
        self.renderer = ToolRenderer(tokenizer, ())
        self.calls = itertools.count(1)

    def reply(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """One sampled reply; a seeded ``params`` gives each call its own seed (``seed + 104729 * k``)."""
        from rlkit.types import ModelInput

        tokens = self.renderer.prompt(messages)
        params = self.params
        if getattr(params, "seed", None) is not None:
            params = params.model_copy(update={"seed": params.seed + 104_729 * next(self.calls)})
        response = self.sampling_client.sample(ModelInput.from_ints(tokens), num_samples=1, sampling_params=params).result()
        return self.tokenizer.decode(list(response.sequences[0].tokens), skip_special_tokens=True)


class ChatEnv(Env):
    """A :class:`TextEnv` as a token environment (see the module docstring)."""

    def __init__(self, text_env: TextEnv, tokenizer: Any, renderer: Any, system_prompt: Optional[str] = None,
                 reset_timeout_s: float = 60.0):
        self.text_env, self.tokenizer, self.renderer = text_env, tokenizer, renderer
        self.system: Messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.reset_timeout_s = reset_timeout_s
        self.history: Messages = []
        self.reset_error = ""

    def initial_observation(self) -> List[int]:
        try:
            first = check_turn(RESET_POOL.submit(self.text_env.reset).result(timeout=self.reset_timeout_s), "reset()")
        except concurrent.futures.TimeoutError:
            self.reset_error = f"reset() exceeded {self.reset_timeout_s}s"
        except Exception as exc:  # noqa: BLE001 - the env's own code may raise anything; its episode fails at its first step
            self.reset_error = f"reset() failed: {type(exc).__name__}: {exc}"
        if self.reset_error:  # sampled once with the group, then failed by step(): counted, not fatal
            return self.renderer.prompt(self.system + [{"role": "user", "content": "(the environment did not start)"}])
        self.history = self.system + [{"role": "user", "content": first.observation}]
        return self.renderer.prompt(self.history)

    def step(self, action: List[int]) -> StepResult:
        if self.reset_error:
            raise RuntimeError(self.reset_error)
        reply = self.tokenizer.decode(action, skip_special_tokens=True)
        turn = check_turn(self.text_env.step(reply), "step()")
        info = {"completion": reply, **turn.info}
        if turn.done:
            return StepResult(reward=float(turn.reward), done=True, metrics=dict(turn.metrics), info=info)
        message = {"role": "user", "content": turn.observation}
        if turn.fresh:
            self.history = self.system + [message]
            return StepResult(reward=float(turn.reward), done=False, next_context=self.renderer.prompt(self.history),
                              metrics=dict(turn.metrics), info=info)
        observation = self.renderer.continuation(self.history, [message], action)
        self.history = self.history + [{"role": "assistant", "content": reply}, message]
        return StepResult(reward=float(turn.reward), done=False, next_observation=observation, metrics=dict(turn.metrics), info=info)

    def close(self) -> None:
        try:
            self.text_env.close()
        except Exception:  # noqa: BLE001 - closing a failed episode must not fail the group
            pass


class TextEnvGroup(EnvGroup):
    """The G episodes of one problem (one seed): a :class:`ChatEnv` each over the task's adapter."""

    def __init__(self, task: "TextEnvTask", problem: Problem, tokenizer: Any):
        self.task, self.problem, self.tokenizer = task, problem, tokenizer
        self.envs: List[ChatEnv] = []
        self.policy: Optional[ChatPolicy] = None

    def use_policy(self, sampling_client: Any, params: Any) -> None:
        self.policy = ChatPolicy(sampling_client, self.tokenizer, params)

    def make_envs(self, n: int) -> List[ChatEnv]:
        renderer = self.task.renderer(self.tokenizer)
        self.envs = [ChatEnv(self.task.make_env(self.problem, self.policy), self.tokenizer, renderer, self.task.system_prompt,
                             self.task.reset_timeout_s) for _ in range(n)]
        return list(self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class TextEnvTask(Task):
    """The task around a text-environment adapter: ``num_train`` training episodes (seeds
    ``seed, seed+1, ...``) and ``num_test`` held-out ones (seeds after those), each a group of G
    episodes on one seed; a subclass implements :meth:`make_env`."""

    name = "text_env"

    def __init__(self, num_train: int = 256, num_test: int = 32, seed: int = 0, system_prompt: Optional[str] = None,
                 reset_timeout_s: float = 60.0):
        if num_train < 0 or num_test < 0:
            raise ConfigError(f"task.num_train={num_train} and task.num_test={num_test} must be >= 0")
        if reset_timeout_s <= 0:
            raise ConfigError(f"task.reset_timeout_s={reset_timeout_s} must be > 0")
        self.num_train, self.num_test, self.seed = int(num_train), int(num_test), int(seed)
        self.system_prompt, self.reset_timeout_s = system_prompt, float(reset_timeout_s)
        self._renderers: Dict[int, Any] = {}

    def problems(self, split: str) -> List[Dict[str, Any]]:
        train = [{"seed": self.seed + i} for i in range(self.num_train)]
        test = [{"seed": self.seed + self.num_train + i} for i in range(self.num_test)]
        return split_problems(self.name, {"train": train, "test": test}, split)

    @abc.abstractmethod
    def make_env(self, problem: Problem, policy: Optional[ChatPolicy]) -> TextEnv:
        """A fresh episode on ``problem`` (``policy``: the current policy as a text player, for an env
        where the model also acts in another seat; ``None`` when the collector gave none)."""

    def renderer(self, tokenizer: Any) -> Any:
        from rlkit.tools.render import ToolRenderer

        key = id(tokenizer)
        if key not in self._renderers:
            self._renderers[key] = ToolRenderer(tokenizer, ())
        return self._renderers[key]

    def env_group(self, problem: Problem, tokenizer: Any) -> TextEnvGroup:
        return TextEnvGroup(self, problem, tokenizer)
