"""Rollout collection: sample a problem's G completions, step the environments, score the group.

:func:`rollout_group` runs one :class:`~rlkit.tasks.base.EnvGroup` in named parts: its G
:class:`Episode` s advanced turn by turn (:func:`run_episodes`, one turn at a time by
:func:`sample_turn` and :meth:`Episode.take`), then scored and put under the failure policy
(:func:`apply_failure_policy`); :func:`run_episode` is one env's episode alone. While the G contexts are identical
(always on the first turn) they are sampled with one ``sample(num_samples=G)`` call, which prefills
the prompt once; later turns, whose contexts differ, submit one request per env at once so the
sampler decodes them in one batch. :func:`collect_groups` runs many groups with bounded concurrency
(their sampling requests meet in the sampler's batch).

Failures (a reward that raises, returns NaN, or exceeds ``timeout_s``) follow
:class:`RolloutPolicy`: ``zero`` scores the rollout ``failure_reward`` and keeps it; ``retry``
re-runs the step up to ``max_retries`` times, then scores it like ``zero``; ``drop`` removes it and
keeps the group if at least ``min_survivors`` rollouts remain; ``fail`` raises. Every failure is
counted in the group (``TrajectoryGroup.failed``). A step in which *every* rollout failed trains
nothing: after ``max_failed_steps`` such steps in a row (1 by default; 0: never) the RL loop stops
with one line (:class:`FailedSteps`, a :class:`RolloutError`: ``rlkit train`` exits 2).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from rlkit.errors import InvalidInputError, OperationError
from rlkit.rl.rank_rollouts import collect_over_ranks, ranks_sharing
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
    max_failed_steps: int = 1  # steps in a row whose every rollout failed before the run stops (0: never)

    def __post_init__(self) -> None:
        if self.on_failure not in ("zero", "retry", "drop", "fail"):
            raise ValueError(f"on_failure={self.on_failure!r} must be zero, retry, drop or fail")
        if self.max_failed_steps < 0:
            raise ValueError(f"max_failed_steps={self.max_failed_steps} must be >= 0 (0: never stop)")


class FailedSteps:
    """Stops a run whose rollouts all fail instead of letting it train nothing and exit 0: a step
    whose every rollout failed (``TrajectoryGroup.failed`` summing to ``group_size`` per group, a
    skipped group counting as all failed) counts; ``policy.max_failed_steps`` of them in a row
    raise :class:`RolloutError` naming the step and the first failure; any other step resets the count."""

    def __init__(self, policy: RolloutPolicy, group_size: int):
        self.limit, self.group_size, self.in_a_row = policy.max_failed_steps, group_size, 0

    def check(self, step: int, groups: Sequence[TrajectoryGroup]) -> None:
        total = self.group_size * len(groups)
        failed = sum(g.failed for g in groups)
        if not groups or failed < total:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.limit and self.in_a_row >= self.limit:
            why = next((t.failure for g in groups for t in g.trajectories if t.failed), "") or next((g.skipped for g in groups if g.skipped), "")
            why = " ".join(why.split())
            why = f"; the first: {why[:300]}" if why else " (the warnings above say why)"
            which = f"of the last {self.in_a_row} steps " if self.in_a_row > 1 else ""
            raise RolloutError(f"step {step}: every rollout {which}failed ({failed} of {total}){why}; nothing was trained, so "
                               "the run stops (train.rollout.max_failed_steps=0 lets it go on)")


# env.step runs on _STEP_POOL (its timeout counts from submission, so the pool is wide enough that a step
# rarely queues); the G episodes of a turn are taken at once on _TAKE_POOL (each waits on its own step)
_STEP_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="rlkit-env-step")
_TAKE_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="rlkit-env-take")


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


class Episode:
    """One environment's episode in progress: its context (what the sampler sees next), its
    trajectory so far, and the observation the next transition records. Token ids flow through
    unchanged: a turn's context is the previous context + the sampled tokens + the env's next
    observation, unless the env rewrites it (``next_context``: a new sequence)."""

    def __init__(self, env: Any, sampler_version: int = 0, index: int = 0):
        self.env, self.index = env, index  # index: its place in the group (its per-turn seed offset)
        self.context: List[int] = list(env.initial_observation())
        self.observation: List[int] = list(self.context)
        self.trajectory = Trajectory(sampler_version=sampler_version)
        self.new_sequence = False
        self.alive = True

    def fail(self, error: str) -> None:
        self.trajectory.failed, self.trajectory.failure, self.alive = True, error, False

    def take(self, seq: Any, policy: RolloutPolicy) -> float:
        """Record the sampled ``seq`` and step the env with it (under ``policy``'s timeout and
        retries); returns the seconds the env (its reward) took."""
        t0 = time.perf_counter()
        result, error = _safe_step(self.env, list(seq.tokens), policy)
        seconds = time.perf_counter() - t0
        transition = Transition(
            observation=self.observation,
            action=list(seq.tokens),
            action_logprobs=list(seq.logprobs or []),
            stop_reason=getattr(seq.stop_reason, "value", str(seq.stop_reason)),
            new_sequence=self.new_sequence,
        )
        self.new_sequence = False
        self.trajectory.transitions.append(transition)
        if result is None:
            if policy.on_failure == "fail":
                raise RolloutError(f"a rollout failed: {error}")
            transition.done = True
            self.fail(error)
            return seconds
        transition.reward, transition.done = float(result.reward), bool(result.done)
        transition.metrics, transition.info = dict(result.metrics), dict(result.info)
        if result.next_context is not None:  # a new sequence: the env rewrote the context
            self.context = self.observation = list(result.next_context)
            self.new_sequence = True
        else:
            self.context = self.context + list(seq.tokens) + list(result.next_observation)
            self.observation = list(result.next_observation)
        self.alive = not result.done and len(self.context) < policy.max_context_tokens
        return seconds


def sample_turn(sampling_client: Any, episodes: Sequence[Episode], params: SamplingParams, seed: Optional[int], turn: int):
    """One sampling turn for the live ``episodes``: ``[(episode, sequence)]`` and the responses.
    While their contexts are identical (always on the first turn) one ``sample(num_samples=n)``
    prefills the shared prompt once; otherwise one request per episode, submitted together so the
    sampler decodes them in one batch. A context the sampler refuses (too long) fails its episode."""
    turn_params = params if seed is None else params.model_copy(update={"seed": seed + turn})
    first = episodes[0].context
    if all(e.context == first for e in episodes):
        response = sampling_client.sample(ModelInput.from_ints(first), num_samples=len(episodes), sampling_params=turn_params).result()
        return list(zip(episodes, response.sequences)), [response]
    submitted = []
    for e in episodes:
        own = turn_params if seed is None else params.model_copy(update={"seed": seed + turn + 7919 * e.index})
        try:
            submitted.append((e, sampling_client.sample(ModelInput.from_ints(e.context), num_samples=1, sampling_params=own)))
        except InvalidInputError as exc:  # this episode's conversation outgrew the context window
            e.fail(str(exc))
    responses = [f.result() for _, f in submitted]
    return [(e, r.sequences[0]) for (e, _), r in zip(submitted, responses)], responses


def apply_failure_policy(trajectories: List[Trajectory], rewards: List[float], policy: RolloutPolicy):
    """``zero``/``retry``: a failed rollout scores ``failure_reward`` and stays; ``drop``: it is
    removed, and the whole group too when fewer than ``min_survivors`` remain."""
    if not any(t.failed for t in trajectories):
        return trajectories, rewards
    if policy.on_failure in ("zero", "retry"):
        return trajectories, [policy.failure_reward if t.failed else r for t, r in zip(trajectories, rewards)]
    kept = [(t, r) for t, r in zip(trajectories, rewards) if not t.failed]
    if len(kept) < policy.min_survivors:
        kept = []
    return [t for t, _ in kept], [r for _, r in kept]


def run_episodes(sampling_client: Any, episodes: Sequence[Episode], params: SamplingParams, policy: RolloutPolicy,
                 seed: Optional[int] = None) -> tuple:
    """Advance ``episodes`` turn by turn until every one is done (or ``policy.max_turns``);
    returns ``(prefill_tokens, decode_tokens, reward_seconds)``."""
    prefill = decode = 0
    reward_seconds = 0.0
    for turn in range(policy.max_turns):
        alive = [e for e in episodes if e.alive]
        if not alive:
            break
        try:
            pairs, responses = sample_turn(sampling_client, alive, params, seed, turn)
        except InvalidInputError as exc:  # the shared context exceeds the window
            if turn == 0:
                raise
            for e in alive:
                e.fail(str(exc))
            break
        for r in responses:
            prefill += r.usage.prefill_tokens
            decode += r.usage.decode_tokens
        if len(pairs) == 1:
            reward_seconds += pairs[0][0].take(pairs[0][1], policy)
        else:  # the episodes' env steps run at once (a remote env's latency is paid once a turn, not G times)
            reward_seconds += sum(_TAKE_POOL.map(lambda pair: pair[0].take(pair[1], policy), pairs))
    return prefill, decode, reward_seconds


def run_episode(sampling_client: Any, env: Any, params: SamplingParams, policy: RolloutPolicy, *,
                sampler_version: int = 0, seed: Optional[int] = None) -> Trajectory:
    """One environment's whole episode (every turn): its trajectory."""
    episode = Episode(env, sampler_version)
    run_episodes(sampling_client, [episode], params, policy, seed)
    return episode.trajectory


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
    """A group = its ``group_size`` episodes (:func:`run_episodes`), scored (the group's joint
    :meth:`~rlkit.tasks.base.EnvGroup.score_group`, else each trajectory's reward), under the
    failure policy (:func:`apply_failure_policy`). ``seed`` overrides ``params.seed``; turn *k*
    uses ``seed + k``. A problem whose prompt the sampler refuses is skipped (an empty group)."""
    own = None  # a group that samples itself (an agent behind the rollout endpoint, rlkit.rl.agents); duck-typed groups never do
    if isinstance(env_group, EnvGroup):
        env_group.use_policy(sampling_client, params)
        own = env_group.rollout(sampling_client, group_size, params, policy, sampler_version=sampler_version, seed=seed)
    if own is not None:
        return own
    episodes = [Episode(env, sampler_version, i) for i, env in enumerate(env_group.make_envs(group_size))]
    try:
        prefill, decode, reward_seconds = run_episodes(sampling_client, episodes, params, policy, seed)
    except InvalidInputError as exc:  # e.g. the prompt exceeds the context window
        log.warning("skipping a problem: %s", exc)
        return TrajectoryGroup(problem=env_group.problem, trajectories=[], rewards=[], failed=group_size, skipped=str(exc))
    trajectories = [e.trajectory for e in episodes]
    failed = sum(t.failed for t in trajectories)
    joint = env_group.score_group(trajectories)  # None (the EnvGroup default): per-trajectory rewards
    rewards = list(joint) if joint is not None else [t.total_reward for t in trajectories]
    trajectories, rewards = apply_failure_policy(trajectories, rewards, policy)
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
    Each group's :meth:`~rlkit.tasks.base.EnvGroup.close` is called once its rollouts are scored.
    On N ranks (``torchrun``) each rank rolls out a share of the groups and every rank returns all of
    them (:mod:`rlkit.rl.rank_rollouts`); ``on_group`` then sees them after the exchange."""
    seeds = list(seeds) if seeds is not None else [None] * len(env_groups)
    if ranks_sharing() > 1:  # torchrun: each rank rolls out a share, every rank gets all (rlkit.rl.rank_rollouts)
        def run(indices: Sequence[int]) -> Dict[int, Any]:
            return _roll_out(sampling_client, [env_groups[i] for i in indices], group_size, params, policy,
                             concurrency, sampler_version, [seeds[i] for i in indices], indices)

        describe = (sampler_version, seeds, params, group_size, [getattr(g, "problem", None) for g in env_groups])
        results = collect_over_ranks(env_groups, run, lambda i: env_groups[i].close(), describe)
        for group in results:
            if on_group is not None:
                on_group(group)
        return results
    results = []
    for _, group in _roll_out(sampling_client, env_groups, group_size, params, policy, concurrency, sampler_version,
                              seeds, range(len(env_groups)), stream=True):
        if isinstance(group, BaseException):
            raise group
        if on_group is not None:
            on_group(group)
        results.append(group)
    return results


def _roll_out(sampling_client, env_groups, group_size, params, policy, concurrency, sampler_version, seeds, indices,
              stream: bool = False):
    """Roll out ``env_groups`` (``indices`` names them), at most ``concurrency`` at a time: ``{index:
    group or the exception it raised}``, or with ``stream`` the pairs in input order as they finish."""
    def pairs():
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="rlkit-rollout") as pool:
            futures = [pool.submit(_rollout_and_close, sampling_client, g, group_size, params, policy, sampler_version, s)
                       for g, s in zip(env_groups, seeds)]
            for i, f in zip(indices, futures):
                try:
                    yield i, f.result()
                except Exception as exc:  # noqa: BLE001 - the caller raises it (on every rank, on N ranks)
                    yield i, exc

    return pairs() if stream else dict(pairs())
