"""Rollout collection: sample a problem's G completions, step the environments, score the group.

:func:`rollout_group` runs one :class:`~rlkit.tasks.base.EnvGroup`. While the G contexts are identical
(always on the first turn) they are sampled with one ``sample(num_samples=G)`` call, which prefills
the prompt once; later turns, whose contexts differ, submit one request per env at once so the
sampler decodes them in one batch. :func:`collect_groups` runs many groups with bounded concurrency
(their sampling requests meet in the sampler's batch).

Failures (a reward that raises, returns NaN, or exceeds ``timeout_s``) follow
:class:`RolloutPolicy`: ``zero`` scores the rollout ``failure_reward`` and keeps it; ``retry``
re-runs the step up to ``max_retries`` times, then scores it like ``zero``; ``drop`` removes it and
keeps the group if at least ``min_survivors`` rollouts remain; ``fail`` raises. Every failure is
counted in the group (``TrajectoryGroup.failed``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from rlkit.errors import InvalidInputError, OperationError
from rlkit.tasks.base import EnvGroup, StepResult, Trajectory, TrajectoryGroup, Transition
from rlkit.types import ModelInput, SamplingParams


log = logging.getLogger("rlkit.rl")


class RolloutError(OperationError):
    """A rollout failed and the policy is ``fail``."""


@dataclass
class RolloutPolicy:
    timeout_s: float = 60.0
    on_failure: str = "zero"  # zero | retry | drop | fail
    failure_reward: float = 0.0
    max_retries: int = 1
    min_survivors: int = 2
    max_turns: int = 1
    max_context_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.on_failure not in ("zero", "retry", "drop", "fail"):
            raise ValueError(f"on_failure={self.on_failure!r} must be zero, retry, drop or fail")


_STEP_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="rlkit-env-step")


def _step_with_timeout(env: Any, action: List[int], timeout_s: float) -> StepResult:
    future = _STEP_POOL.submit(env.step, action)
    try:
        result = future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"env.step exceeded {timeout_s}s") from None
    if not isinstance(result, StepResult):
        raise TypeError(f"env.step returned {type(result).__name__}, not StepResult")
    if not math.isfinite(result.reward):
        raise ValueError(f"reward is {result.reward}")
    return result


def _safe_step(env: Any, action: List[int], policy: RolloutPolicy) -> tuple[Optional[StepResult], str]:
    attempts = 1 + (policy.max_retries if policy.on_failure == "retry" else 0)
    error = ""
    for _ in range(attempts):
        try:
            return _step_with_timeout(env, action, policy.timeout_s), ""
        except Exception as exc:  # noqa: BLE001 - a user reward/env may raise anything
            error = f"{type(exc).__name__}: {exc}"
    return None, error


def rollout_group(
    sampling_client: Any,
    env_group: EnvGroup,
    group_size: int,
    params: SamplingParams,
    policy: RolloutPolicy,
    *,
    sampler_version: int = 0,
    seed: Optional[int] = None,
) -> TrajectoryGroup:
    """Sample and score the ``group_size`` trajectories of one problem (``seed`` overrides
    ``params.seed``; turn *k* uses ``seed + k``)."""
    prefill = decode = 0
    reward_seconds = 0.0
    envs = env_group.make_envs(group_size)
    contexts = [list(env.initial_observation()) for env in envs]
    trajectories = [Trajectory(sampler_version=sampler_version) for _ in envs]
    pending_obs = [list(c) for c in contexts]
    new_sequence = [False] * group_size
    alive = list(range(group_size))
    for turn in range(policy.max_turns):
        if not alive:
            break
        turn_params = params if seed is None else params.model_copy(update={"seed": seed + turn})
        first = contexts[alive[0]]
        if all(contexts[i] == first for i in alive):
            try:
                responses = [sampling_client.sample(ModelInput.from_ints(first), num_samples=len(alive), sampling_params=turn_params).result()]
            except InvalidInputError as exc:  # e.g. the prompt exceeds the context window
                if turn == 0:
                    log.warning("skipping a problem: %s", exc)
                    return TrajectoryGroup(problem=env_group.problem, trajectories=[], rewards=[], failed=group_size, skipped=str(exc))
                for i in alive:
                    trajectories[i].failed, trajectories[i].failure = True, str(exc)
                break
            seqs = responses[0].sequences
        else:
            responses, seqs, sampled = [], [], []
            for i in alive:
                try:
                    future = sampling_client.sample(
                        ModelInput.from_ints(contexts[i]),
                        num_samples=1,
                        sampling_params=turn_params if seed is None else params.model_copy(update={"seed": seed + turn + 7919 * i}),
                    )
                except InvalidInputError as exc:  # this env's conversation outgrew the context window
                    trajectories[i].failed, trajectories[i].failure = True, str(exc)
                    continue
                sampled.append((i, future))
            alive = [i for i, _ in sampled]
            responses = [f.result() for _, f in sampled]
            seqs = [r.sequences[0] for r in responses]
        for r in responses:
            prefill += r.usage.prefill_tokens
            decode += r.usage.decode_tokens
        still_alive = []
        for i, seq in zip(alive, seqs):
            t0 = time.perf_counter()
            result, error = _safe_step(envs[i], list(seq.tokens), policy)
            reward_seconds += time.perf_counter() - t0
            transition = Transition(
                observation=pending_obs[i],
                action=list(seq.tokens),
                action_logprobs=list(seq.logprobs or []),
                stop_reason=getattr(seq.stop_reason, "value", str(seq.stop_reason)),
                new_sequence=new_sequence[i],
            )
            new_sequence[i] = False
            trajectories[i].transitions.append(transition)
            if result is None:
                if policy.on_failure == "fail":
                    raise RolloutError(f"rollout {i} of problem failed: {error}")
                trajectories[i].failed, trajectories[i].failure = True, error
                transition.done = True
                continue
            transition.reward, transition.done = float(result.reward), bool(result.done)
            transition.metrics, transition.info = dict(result.metrics), dict(result.info)
            if result.next_context is not None:  # a new sequence: the env rewrote the context
                contexts[i] = list(result.next_context)
                pending_obs[i] = list(result.next_context)
                new_sequence[i] = True
            else:
                contexts[i] = contexts[i] + list(seq.tokens) + list(result.next_observation)
                pending_obs[i] = list(result.next_observation)
            if not result.done and len(contexts[i]) < policy.max_context_tokens:
                still_alive.append(i)
        alive = still_alive

    failed = sum(t.failed for t in trajectories)
    joint = env_group.score_group(trajectories)  # None (the EnvGroup default): per-trajectory rewards
    rewards = list(joint) if joint is not None else [t.total_reward for t in trajectories]
    if failed and policy.on_failure in ("zero", "retry"):
        rewards = [policy.failure_reward if t.failed else r for t, r in zip(trajectories, rewards)]
    elif failed and policy.on_failure == "drop":
        kept = [(t, r) for t, r in zip(trajectories, rewards) if not t.failed]
        if len(kept) < policy.min_survivors:
            kept = []
        trajectories, rewards = [t for t, _ in kept], [r for _, r in kept]
    return TrajectoryGroup(
        problem=env_group.problem,
        trajectories=trajectories,
        rewards=rewards,
        sampler_version=sampler_version,
        failed=failed,
        prefill_tokens=prefill,
        decode_tokens=decode,
        reward_seconds=reward_seconds,
    )


def _rollout_and_close(sampling_client, env_group, group_size, params, policy, sampler_version, seed) -> TrajectoryGroup:
    try:
        return rollout_group(sampling_client, env_group, group_size, params, policy, sampler_version=sampler_version, seed=seed)
    finally:
        env_group.close()


def collect_groups(
    sampling_client: Any,
    env_groups: Sequence[EnvGroup],
    group_size: int,
    params: SamplingParams,
    policy: RolloutPolicy,
    *,
    concurrency: int = 8,
    sampler_version: int = 0,
    seeds: Optional[Sequence[int]] = None,
    on_group: Optional[Callable[[TrajectoryGroup], None]] = None,
) -> List[TrajectoryGroup]:
    """Roll out every group, at most ``concurrency`` at a time; results keep the input order.
    Each group's :meth:`~rlkit.tasks.base.EnvGroup.close` is called once its rollouts are scored."""
    seeds = list(seeds) if seeds is not None else [None] * len(env_groups)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="rlkit-rollout") as pool:
        futures = [
            pool.submit(_rollout_and_close, sampling_client, g, group_size, params, policy, sampler_version, s)
            for g, s in zip(env_groups, seeds)
        ]
        results = []
        for f in futures:
            group = f.result()
            if on_group is not None:
                on_group(group)
            results.append(group)
    return results
