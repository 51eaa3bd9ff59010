"""Agents written against the OpenAI client, trained by rlkit's RL loop (``train.task.name=agent``).

An agent is a plain function that knows nothing of rlkit::

    def my_agent(problem, *, base_url, model):
        client = openai.OpenAI(base_url=base_url, api_key="rlkit")
        ...  # its own prompts, tools and turns: client.chat.completions.create(model=model, ...)
        return reward          # a float, a RewardResult, or a final answer str graded by the task

Config::

    train:
      task:
        name: agent
        agent: my_pkg.agents:my_agent          # "module:function"
        task: {name: arithmetic, num_shots: 0}  # where problems come from (and how a str answer is graded)
        timeout_s: 120                          # per episode

Each rollout of a group is one episode: :class:`~rlkit.serve.rollouts.RolloutEndpoint` (one per
task, started on first use) opens an episode on the step's sampling client and the run's sampling
settings, the agent runs on a thread with ``model=<episode id>``, and the recorded calls become the
trajectory (:meth:`~rlkit.serve.rollouts.EpisodeRecord.trajectory`: exact prompt and sampled tokens
and logprobs; a turn whose prompt does not extend the previous one is a new sequence). The G
episodes of a group run at once, so their requests meet in the sampler's batch.

Failures follow ``train.rollout.on_failure`` like any reward: an agent that raises, returns
something that is not a reward, makes no call or runs past ``timeout_s`` fails its episode
(``retry`` runs it again up to ``max_retries`` times); the failure is counted in ``rollout/failed``
and ``reward/agent/failed``, and the run goes on. A timed-out agent's thread cannot be killed: its
episode is closed, so its further calls are refused (404).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from rlkit.errors import ConfigError
from rlkit.rewards.base import RewardResult, as_result
from rlkit.rl.collect import RolloutError, RolloutPolicy, apply_failure_policy
from rlkit.tasks.base import EnvGroup, Task, Trajectory, TrajectoryGroup, build_task
from rlkit.types import SamplingParams

log = logging.getLogger("rlkit.rl")


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


class AgentEnvGroup(EnvGroup):
    """The G episodes of one problem, each a run of the agent (rolls out itself: :meth:`rollout`)."""

    def __init__(self, task: AgentTask, problem: Mapping[str, Any]):
        self.task, self.problem = task, problem

    def make_envs(self, n: int) -> List[Any]:
        raise ConfigError("an agent's episodes are driven by the agent itself (AgentEnvGroup.rollout), not stepped as envs")

    def _episode(self, sampling_client: Any, params: SamplingParams, version: int) -> Tuple[Trajectory, str]:
        """One run of the agent: its trajectory, and why it failed ("" when it did not)."""
        endpoint = self.task.endpoint()
        episode = endpoint.open(sampling_client, params)
        future = self.task._pool.submit(self.task.agent, dict(self.problem), base_url=endpoint.base_url, model=episode)
        error = ""
        try:
            result = _as_reward(future.result(timeout=self.task.timeout_s), self.task, self.problem)
        except concurrent.futures.TimeoutError:
            error, result = f"TimeoutError: the agent ran past task.timeout_s={self.task.timeout_s}s", None
        except Exception as exc:  # noqa: BLE001 - an agent may raise anything
            error, result = f"{type(exc).__name__}: {exc}", None
        record = endpoint.close(episode)
        traj = record.trajectory(version)
        if not error and not traj.transitions:
            error = "the agent made no chat.completions call on its episode"
        if error:
            traj.failed, traj.failure = True, error
        if traj.transitions:
            last = traj.transitions[-1]
            last.metrics = {"agent/failed": float(bool(error)), "agent/calls": float(len(record.calls)),
                            "agent/new_sequences": float(sum(t.new_sequence for t in traj.transitions))}
            if result is not None:
                last.reward = float(result.reward)
                last.metrics.update(result.metrics)
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
