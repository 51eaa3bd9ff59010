"""Agents written against the OpenAI client, trained by rlkit's RL loop (``train.task.name=agent``).

An agent is a plain function that knows nothing of rlkit, sync or ``async``::

    def my_agent(problem, *, base_url, model):
        client = openai.OpenAI(base_url=base_url, api_key="rlkit")
        ...  # its own prompts, tools and turns: client.chat.completions.create(model=model, ...)
        return reward          # a float, a RewardResult, or a final answer str graded by the task

    async def my_async_agent(problem, *, base_url, model):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="rlkit")
        ...  # await client.chat.completions.create(model=model, ...)
        return reward

Config::

    train:
      task:
        name: agent
        agent: my_pkg.agents:my_agent          # "module:function"
        task: {name: arithmetic, num_shots: 0}  # where problems come from (and how a str answer is graded)
        timeout_s: 120                          # per episode

Each rollout of a group is one episode: :class:`~rlkit.serve.rollouts.RolloutEndpoint` (one per
task, started on first use) opens an episode on the step's sampling client and the run's sampling
settings, the agent runs with ``model=<episode id>``, and the recorded calls become the trajectory
(:meth:`~rlkit.serve.rollouts.EpisodeRecord.trajectory`: exact prompt and sampled tokens and
logprobs; a turn whose prompt does not extend the previous one is a new sequence). The G episodes
of a group run at once, so their requests meet in the sampler's batch:

- a sync agent runs each episode on its own thread;
- an ``async def`` agent (a coroutine function, or a callable whose ``__call__`` is one) runs the
  G episodes as tasks of one event loop per group (``asyncio.gather``), on one thread; each episode
  is awaited under ``asyncio.wait_for(timeout_s)``, so a timed-out episode is cancelled. An async
  agent must not block its loop (a sync call inside ``async def`` stalls the group's other
  episodes); a loop still busy ``timeout_s + 5`` s after it started is abandoned, its unfinished
  episodes fail and are closed. A sync callable that returns an awaitable is awaited too (on its
  episode's thread).

Failures follow ``train.rollout.on_failure`` like any reward: an agent that raises, returns
something that is not a reward, makes no call or runs past ``timeout_s`` fails its episode
(``retry`` runs it again up to ``max_retries`` times); the failure is counted in ``rollout/failed``
and in ``reward/agent/failed`` (the agent's metrics belong to the episode, so an agent that fails
before its first call counts too), and the run goes on, unless every rollout of a step failed
(``train.rollout.max_failed_steps``, :class:`~rlkit.rl.collect.FailedSteps`). A timed-out sync
agent's thread cannot be killed: its episode is closed, so its further calls are refused (404).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from rlkit.errors import ConfigError
from rlkit.rewards.base import RewardResult, as_result
from rlkit.rl.collect import RolloutError, RolloutPolicy, apply_failure_policy
from rlkit.tasks.base import EnvGroup, Task, Trajectory, TrajectoryGroup, build_task
from rlkit.types import SamplingParams

log = logging.getLogger("rlkit.rl")

#: how long past ``timeout_s`` a group's event loop may stay busy (an async agent blocking it) before it is abandoned
LOOP_GRACE_S = 5.0


def is_async_agent(agent: Callable[..., Any]) -> bool:
    """Whether ``agent`` is a coroutine function (or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(agent) or (not inspect.isroutine(agent) and inspect.iscoroutinefunction(type(agent).__call__))


class AgentTask(Task):
    """Problems from ``task``; each rollout is one run of ``agent`` through the rollout endpoint."""

    name = "agent"

    def __init__(self, agent: Any = None, task: Optional[Dict[str, Any]] = None, timeout_s: float = 300.0, max_workers: int = 32,
                 host: str = "127.0.0.1"):
        if agent is None:
            raise ConfigError("task.agent: the agent function, 'module:function' (see rlkit/rl/agents.py)")
        if isinstance(agent, str):
            from rlkit.imports import import_object

            agent = import_object(agent, "task.agent")
        if not callable(agent):
            raise ConfigError(f"task.agent: {agent!r} is not callable")
        if not task:
            raise ConfigError("task.task: the task the agent's problems come from (e.g. {name: arithmetic})")
        if timeout_s <= 0:
            raise ConfigError(f"task.timeout_s={timeout_s} must be > 0")
        self.agent: Callable[..., Any] = agent
        self.is_async = is_async_agent(agent)
        self.inner = build_task(task, "task.task")
        self.timeout_s, self.host = float(timeout_s), host
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rlkit-agent")
        self._endpoint: Any = None
        self._lock = threading.Lock()

    def endpoint(self) -> Any:
        from rlkit.serve.rollouts import RolloutEndpoint

        with self._lock:
            if self._endpoint is None:
                self._endpoint = RolloutEndpoint().start(host=self.host)
            return self._endpoint

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return self.inner.problems(split)

    def reward(self, completion: str, problem: Mapping[str, Any]) -> Any:
        return self.inner.reward(completion, problem)

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> "AgentEnvGroup":
        return AgentEnvGroup(self, problem)

    def close(self) -> None:
        with self._lock:
            if self._endpoint is not None:
                self._endpoint.stop()
                self._endpoint = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.inner.close()


@dataclass
class AgentTrajectory(Trajectory):
    """An episode's trajectory with the metrics that belong to the episode rather than to a turn
    (``agent/failed``, ``agent/calls``, ...): an episode that failed before its first call has no
    transition but still reports them."""

    episode_metrics: Dict[str, float] = field(default_factory=dict)

    @property
    def metrics(self) -> Dict[str, float]:
        return {**super().metrics, **self.episode_metrics}


def _as_reward(value: Any, task: AgentTask, problem: Mapping[str, Any]) -> RewardResult:
    if isinstance(value, str):
        return as_result(task.inner.reward(value, problem))
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, (int, float)):  # bool included
        result = as_result(float(value))
    else:
        raise TypeError(f"the agent returned {type(value).__name__}; return a float, a RewardResult or a final answer str")
    if not math.isfinite(result.reward):
        raise ValueError(f"the agent's reward is {result.reward}")
    return result


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _call_sync(agent: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a sync agent on this thread; an awaitable it returns is awaited on a loop of its own."""
    value = agent(*args, **kwargs)
    return asyncio.run(_awaited(value)) if inspect.isawaitable(value) else value


class AgentEnvGroup(EnvGroup):
    """The G episodes of one problem, each a run of the agent (rolls out itself: :meth:`rollout`)."""

    def __init__(self, task: AgentTask, problem: Mapping[str, Any]):
        self.task, self.problem = task, problem

    def make_envs(self, n: int) -> List[Any]:
        raise ConfigError("an agent's episodes are driven by the agent itself (AgentEnvGroup.rollout), not stepped as envs")

    def _episode(self, sampling_client: Any, params: SamplingParams, version: int) -> Tuple[Trajectory, str]:
        """One run of a sync agent on the task's pool: its trajectory, and why it failed ("" when it did not)."""
        endpoint = self.task.endpoint()
        episode = endpoint.open(sampling_client, params)
        future = self.task._pool.submit(_call_sync, self.task.agent, dict(self.problem), base_url=endpoint.base_url, model=episode)
        value, error = None, ""
        try:
            value = future.result(timeout=self.task.timeout_s)
        except concurrent.futures.TimeoutError:
            error = f"TimeoutError: the agent ran past task.timeout_s={self.task.timeout_s}s"
        except Exception as exc:  # noqa: BLE001 - an agent may raise anything
            error = _error(exc)
        return self._finish(endpoint, episode, value, error, version)

    def _run_async(self, sampling_client: Any, params: Dict[int, SamplingParams]) -> Dict[int, Tuple[str, Any, str]]:
        """Run an async agent's episodes ``{index: params}`` as tasks of one event loop (on the task's
        pool, waited for at most ``timeout_s + LOOP_GRACE_S``): ``{index: (episode id, value, error)}``."""
        endpoint = self.task.endpoint()
        episodes = {i: endpoint.open(sampling_client, p) for i, p in params.items()}
        outcomes: Dict[int, Tuple[Any, str]] = {}
        timeout = self.task.timeout_s

        async def one(i: int, episode: str) -> None:
            try:
                value = await asyncio.wait_for(self.task.agent(dict(self.problem), base_url=endpoint.base_url, model=episode), timeout)
                outcomes[i] = (value, "")
            except asyncio.TimeoutError:
                outcomes[i] = (None, f"TimeoutError: the agent ran past task.timeout_s={timeout}s")
            except Exception as exc:  # noqa: BLE001 - an agent may raise anything
                outcomes[i] = (None, _error(exc))

        async def group() -> None:
            await asyncio.gather(*(one(i, e) for i, e in episodes.items()))

        future = self.task._pool.submit(asyncio.run, group())
        missing = ""
        try:
            future.result(timeout=timeout + LOOP_GRACE_S)
        except concurrent.futures.TimeoutError:
            missing = (f"TimeoutError: the agent's event loop was still busy {timeout + LOOP_GRACE_S:g}s after it started "
                       f"(task.timeout_s={timeout}s; an async agent must not make blocking calls)")
        except Exception as exc:  # noqa: BLE001 - the loop itself failed
            missing = _error(exc)
        done = dict(outcomes)  # an abandoned loop may still write; what it writes now is ignored
        return {i: (episode, *done.get(i, (None, missing))) for i, episode in episodes.items()}

    def _finish(self, endpoint: Any, episode: str, value: Any, error: str, version: int) -> Tuple[Trajectory, str]:
        """Grade the agent's ``value`` and close ``episode``: its trajectory, and why it failed ("" when it did not)."""
        result = None
        if not error:
            try:
                result = _as_reward(value, self.task, self.problem)
            except Exception as exc:  # noqa: BLE001 - a bad return value or a grader that raises
                error = _error(exc)
        record = endpoint.close(episode)
        traj = AgentTrajectory(transitions=record.trajectory(version).transitions, sampler_version=version)
        if not error and not traj.transitions:
            error = "the agent made no chat.completions call on its episode"
        if error:
            traj.failed, traj.failure = True, error
        traj.episode_metrics = {"agent/failed": float(bool(error)), "agent/calls": float(len(record.calls)),
                                "agent/new_sequences": float(sum(t.new_sequence for t in traj.transitions))}
        if result is not None and not error:
            last = traj.transitions[-1]
            last.reward = float(result.reward)
            traj.episode_metrics.update(result.metrics)
            last.info = dict(result.info)
        return traj, error

    def rollout(self, sampling_client: Any, group_size: int, params: SamplingParams, policy: RolloutPolicy, *,
                sampler_version: int = 0, seed: Optional[int] = None) -> TrajectoryGroup:
        """Run the agent ``group_size`` times at once (episode *i* samples with seed ``seed + 7919 i``)."""
        def params_for(i: int) -> SamplingParams:
            return params if seed is None else params.model_copy(update={"seed": seed + 7919 * i})

        attempts = 1 + (policy.max_retries if policy.on_failure == "retry" else 0)
        trajectories: List[Optional[Trajectory]] = [None] * group_size
        todo = list(range(group_size))
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, group_size), thread_name_prefix="rlkit-episode") as pool:
            for _ in range(attempts):
                if self.task.is_async:
                    endpoint = self.task.endpoint()
                    ran = self._run_async(sampling_client, {i: params_for(i) for i in todo})
                    done = {i: pool.submit(self._finish, endpoint, episode, value, error, sampler_version)
                            for i, (episode, value, error) in ran.items()}
                else:
                    done = {i: pool.submit(self._episode, sampling_client, params_for(i), sampler_version) for i in todo}
                todo = []
                for i, f in done.items():
                    trajectories[i], error = f.result()
                    if error:
                        log.warning("agent episode failed: %s", error)
                        todo.append(i)
                if not todo:
                    break
        trajs = [t for t in trajectories if t is not None]
        failed = sum(t.failed for t in trajs)
        if failed and policy.on_failure == "fail":
            raise RolloutError(f"an agent episode failed: {next(t.failure for t in trajs if t.failed)}")
        rewards = [t.total_reward for t in trajs]
        kept, rewards = apply_failure_policy(trajs, rewards, policy)
        return TrajectoryGroup(problem=self.problem, trajectories=kept, rewards=rewards, sampler_version=sampler_version, failed=failed,
                               prefill_tokens=sum(len(x.observation) for t in trajs for x in t.transitions),
                               decode_tokens=sum(t.num_action_tokens for t in trajs))
