"""Rollouts on the tiny model: group collection, alignment with the trainer, multi-turn, failures."""

import math

import pytest

from rlkit.rl.collect import RolloutError, RolloutPolicy, collect_groups, rollout_group
from rlkit.rl.datums import trajectory_datum
from rlkit.rl.env import SingleTurnEnvGroup, StepResult
from rlkit.types import SamplingParams

PROMPT = [1, 85, 91, 326, 71, 79, 201, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]


def constant_reward(value):
    return lambda completion, problem: value


@pytest.fixture(scope="module")
def sampler(service):
    return service.create_sampling_client(base_model="tiny")


def test_group_collection_and_alignment(service, sampler):
    tokenizer = sampler.get_tokenizer()
    group = SingleTurnEnvGroup(PROMPT, {"q": 1}, lambda c, p: float(len(c) % 2), tokenizer)
    params = SamplingParams(max_tokens=6, temperature=1.0)
    out = rollout_group(sampler, group, 5, params, RolloutPolicy(), seed=11)
    assert len(out.trajectories) == 5 and len(out.rewards) == 5
    assert out.prefill_tokens == len(PROMPT)  # one sample(num_samples=5) call: prefilled once
    assert out.decode_tokens == sum(t.num_action_tokens for t in out.trajectories)
    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8)
    try:
        for traj in out.trajectories:
            t = traj.transitions[0]
            assert len(t.action) == len(t.action_logprobs) > 0
            datum = trajectory_datum(traj, advantage=0.5, temperature=1.0)
            n = datum.model_input.length
            assert datum.model_input.to_ints() == PROMPT + t.action
            w = datum.loss_fn_inputs["weights"].tolist()
            assert w == [0.0] * (len(PROMPT) - 1) + [1.0] * len(t.action) + [0.0]
            lp = trainer.forward([datum], "ppo").result().loss_fn_outputs[0]["logprobs"].tolist()
            sampled = datum.loss_fn_inputs["logprobs"].tolist()
            for i in range(n):
                if w[i]:
                    assert lp[i] == pytest.approx(sampled[i], abs=1e-4)
            assert datum.loss_fn_inputs["advantages"].tolist()[len(PROMPT) - 1] == 0.5
    finally:
        trainer.stop()
    again = rollout_group(sampler, group, 5, params, RolloutPolicy(), seed=11)
    assert [t.transitions[0].action for t in again.trajectories] == [t.transitions[0].action for t in out.trajectories]


class TwoTurnEnv:
    """Turn 1: any answer gets feedback tokens; turn 2 ends the episode with reward 1."""

    def __init__(self, feedback):
        self.turn = 0
        self.feedback = feedback

    def initial_observation(self):
        return list(PROMPT)

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return StepResult(reward=0.25, done=False, next_observation=list(self.feedback))
        return StepResult(reward=1.0, done=True)


class TwoTurnGroup:
    problem = {"id": "two-turn"}

    def make_envs(self, n):
        return [TwoTurnEnv([2, 1, 40 + i, 41]) for i in range(n)]

    def score_group(self, trajectories):
        return None


def test_multi_turn_keeps_tokens_as_sampled(sampler):
    out = rollout_group(sampler, TwoTurnGroup(), 3, SamplingParams(max_tokens=4, temperature=1.0), RolloutPolicy(max_turns=2), seed=1)
    for i, traj in enumerate(out.trajectories):
        assert len(traj.transitions) == 2
        first, second = traj.transitions
        assert second.observation == [2, 1, 40 + i, 41]
        assert traj.tokens == PROMPT + first.action + [2, 1, 40 + i, 41] + second.action
        datum = trajectory_datum(traj, 1.0)
        w = datum.loss_fn_inputs["weights"].tolist()
        feedback_start = len(PROMPT) + len(first.action)
        assert w[feedback_start - 1] == 0.0 and w[feedback_start + 3] == 1.0  # feedback not trained; turn-2 action is
    assert out.rewards == [1.25] * 3


def test_failures_follow_the_policy(sampler):
    tok = sampler.get_tokenizer()
    import threading

    calls, lock = {"n": 0}, threading.Lock()

    def flaky(completion, problem):  # the first two calls fail, whichever episodes make them (they step at once)
        with lock:
            calls["n"] += 1
            down = calls["n"] <= 2
        if down:
            raise RuntimeError("reward server down")
        return 1.0

    params = SamplingParams(max_tokens=2)
    nan_group = SingleTurnEnvGroup(PROMPT, {}, constant_reward(float("nan")), tok)
    zero = rollout_group(sampler, nan_group, 3, params, RolloutPolicy(on_failure="zero", failure_reward=-1.0))
    assert zero.rewards == [-1.0] * 3 and zero.failed == 3
    assert "reward is nan" in zero.trajectories[0].failure
    dropped = rollout_group(sampler, nan_group, 3, params, RolloutPolicy(on_failure="drop"))
    assert dropped.trajectories == [] and dropped.failed == 3
    retried = rollout_group(sampler, SingleTurnEnvGroup(PROMPT, {}, flaky, tok), 2, params, RolloutPolicy(on_failure="retry", max_retries=2))
    assert retried.rewards == [1.0, 1.0] and retried.failed == 0
    with pytest.raises(RolloutError, match="reward server down"):
        calls["n"] = 0
        rollout_group(sampler, SingleTurnEnvGroup(PROMPT, {}, flaky, tok), 2, params, RolloutPolicy(on_failure="fail"))

    def slow(completion, problem):
        import time

        time.sleep(2)
        return 1.0

    timed = rollout_group(sampler, SingleTurnEnvGroup(PROMPT, {}, slow, tok), 1, params, RolloutPolicy(timeout_s=0.1))
    assert timed.failed == 1 and "exceeded" in timed.trajectories[0].failure


def test_collect_groups_keeps_order_and_batches(sampler):
    tok = sampler.get_tokenizer()
    groups = [SingleTurnEnvGroup(PROMPT[: 10 + i], {"i": i}, constant_reward(float(i)), tok) for i in range(4)]
    out = collect_groups(sampler, groups, 2, SamplingParams(max_tokens=3), RolloutPolicy(), concurrency=4, seeds=[1, 2, 3, 4])
    assert [g.problem["i"] for g in out] == [0, 1, 2, 3]
    assert [g.rewards for g in out] == [[float(i)] * 2 for i in range(4)]
    assert not out[0].has_variance and math.isfinite(sum(out[3].rewards))


def test_prompt_longer_than_the_context_window_skips_the_group(sampler):
    tok = sampler.get_tokenizer()
    too_long = SingleTurnEnvGroup([1] * 5000, {"id": "long"}, constant_reward(1.0), tok)
    fine = SingleTurnEnvGroup(PROMPT, {"id": "ok"}, constant_reward(1.0), tok)
    out = collect_groups(sampler, [too_long, fine], 2, SamplingParams(max_tokens=2), RolloutPolicy())
    assert out[0].trajectories == [] and out[0].failed == 2 and "context window" in out[0].skipped
    assert len(out[1].trajectories) == 2 and not out[1].skipped


def test_run_episode_is_one_env_of_a_group(sampler):
    """run_episode(sampler, env) runs the same turns as that env inside a group (same seed offset
    for the first env: index 0), keeping its tokens as sampled."""
    from rlkit.rl.collect import run_episode

    params = SamplingParams(max_tokens=4, temperature=1.0)
    alone = run_episode(sampler, TwoTurnEnv([2, 1, 40, 41]), params, RolloutPolicy(max_turns=2), seed=5)
    assert [t.reward for t in alone.transitions] == [0.25, 1.0] and not alone.failed
    assert alone.tokens == PROMPT + alone.transitions[0].action + [2, 1, 40, 41] + alone.transitions[1].action
    first_turn = rollout_group(sampler, TwoTurnGroup(), 1, params, RolloutPolicy(max_turns=1), seed=5)
    assert first_turn.trajectories[0].transitions[0].action == alone.transitions[0].action


def test_failed_steps_stop_a_run_after_max_failed_steps_whole_failures_in_a_row():
    from rlkit.rl.collect import FailedSteps
    from rlkit.tasks.base import Trajectory, TrajectoryGroup

    def group(failed, g=2):  # under on_failure=drop the failed trajectories are gone, the count stays
        return TrajectoryGroup(problem={}, trajectories=[Trajectory(failed=True, failure="ValueError: reward is\nnan")] * failed,
                               rewards=[0.0] * failed, failed=failed)

    once = FailedSteps(RolloutPolicy(), 2)  # default: the first whole failure stops
    once.check(0, [group(2), group(1)])  # 3 of 4: goes on
    once.check(1, [])  # nothing drawn: no verdict
    with pytest.raises(RolloutError, match=r"^step 2: every rollout failed \(4 of 4\); the first: ValueError: reward is nan; nothing"):
        once.check(2, [group(2), group(2)])
    skipped = TrajectoryGroup(problem={}, trajectories=[], rewards=[], failed=2, skipped="prompt too long")
    with pytest.raises(RolloutError, match="the first: prompt too long"):
        FailedSteps(RolloutPolicy(), 2).check(0, [skipped])
    three = FailedSteps(RolloutPolicy(max_failed_steps=3), 2)
    for step in (0, 1, 2, 3):
        three.check(step, [group(2)] if step != 1 else [group(1)])  # step 1 resets the count
    with pytest.raises(RolloutError, match=r"^step 4: every rollout of the last 3 steps failed"):
        three.check(4, [group(2)])
    never = FailedSteps(RolloutPolicy(max_failed_steps=0), 2)
    for step in range(5):
        never.check(step, [group(2)])
    with pytest.raises(ValueError, match="max_failed_steps=-1"):
        RolloutPolicy(max_failed_steps=-1)
