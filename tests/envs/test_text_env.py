"""The one text-environment interface (rlkit/tasks/envs/text.py): turns rendered token-in/token-out
with the model's own template, fresh contexts, and failures that stay in their episode."""

from __future__ import annotations

import time

import pytest

from rlkit.rl.collect import RolloutPolicy, rollout_group
from rlkit.tasks.envs.text import ChatEnv, TextEnv, TextEnvTask, TextTurn
from rlkit.tools.render import ToolRenderer
from rlkit.types import SamplingParams


@pytest.fixture(scope="module")
def tokenizer():
    from rlkit.backends.local.models import load_tokenizer

    return load_tokenizer("tiny")


class Script(TextEnv):
    """Observations from a list; reward 1 on the last reply; ``fresh`` turns when asked."""

    def __init__(self, observations, fresh=False, fail=""):
        self.observations, self.fresh, self.fail, self.replies, self.closed = list(observations), fresh, fail, [], False

    def reset(self):
        if self.fail == "reset":
            raise RuntimeError("no start")
        if self.fail == "hang_reset":
            time.sleep(1.5)
        return TextTurn(observation=self.observations.pop(0))

    def step(self, reply):
        self.replies.append(reply)
        if self.fail == "step":
            raise RuntimeError("crashed")
        if self.fail == "malformed":
            return TextTurn(observation={"not": "text"})
        if self.fail == "nan":
            return TextTurn(reward=float("nan"), done=True)
        if not self.observations:
            return TextTurn(reward=1.0, done=True, metrics={"solved": 1.0})
        return TextTurn(observation=self.observations.pop(0), reward=0.25, fresh=self.fresh)

    def close(self):
        self.closed = True


def test_turns_continue_the_sampled_tokens_exactly_as_the_template_renders_the_conversation(tokenizer):
    renderer = ToolRenderer(tokenizer, ())
    env = ChatEnv(Script(["first?", "second?"]), tokenizer, renderer, system_prompt="Play.")
    prompt = env.initial_observation()
    conversation = [{"role": "system", "content": "Play."}, {"role": "user", "content": "first?"}]
    assert prompt == renderer.prompt(conversation)
    reply = {"role": "assistant", "content": "a move"}
    action = renderer.turn_tokens(conversation, reply)  # what a model emits, through its end-of-turn token
    result = env.step(action)
    assert (result.reward, result.done, result.next_context) == (0.25, False, None)
    conversation += [reply, {"role": "user", "content": "second?"}]
    assert prompt + action + result.next_observation == renderer.prompt(conversation)  # one sequence, sampled tokens kept
    assert env.text_env.replies == ["a move"]
    last = env.step(renderer.turn_tokens(conversation, {"role": "assistant", "content": "done"}))
    assert (last.reward, last.done, last.metrics) == (1.0, True, {"solved": 1.0})


def test_a_fresh_observation_starts_a_new_context(tokenizer):
    renderer = ToolRenderer(tokenizer, ())
    env = ChatEnv(Script(["board 1", "board 2"], fresh=True), tokenizer, renderer)
    env.initial_observation()
    result = env.step(tokenizer.encode("x", add_special_tokens=False))
    assert result.next_context == renderer.prompt([{"role": "user", "content": "board 2"}])
    assert result.next_observation == []


class ScriptTask(TextEnvTask):
    name = "script"

    def __init__(self, fails, **kw):
        super().__init__(num_train=2, num_test=1, reset_timeout_s=0.5, **kw)
        self.fails, self.made = list(fails), []

    def make_env(self, problem, policy):
        env = Script(["go", "again"], fail=self.fails[len(self.made)])
        self.made.append(env)
        return env


@pytest.mark.parametrize("policy", [RolloutPolicy(max_turns=3, timeout_s=5), RolloutPolicy(max_turns=3, timeout_s=5, on_failure="drop", min_survivors=1)])
def test_an_env_that_raises_hangs_or_answers_malformed_fails_its_episode_only(service, tokenizer, policy):
    task = ScriptTask(["", "reset", "hang_reset", "step", "malformed", "nan"])
    sampler = service.create_sampling_client(base_model="tiny")
    group = task.env_group(task.problems("train")[0], tokenizer)
    out = rollout_group(sampler, group, 6, SamplingParams(max_tokens=3, temperature=1.0, seed=1), policy)
    group.close()
    assert out.failed == 5
    failures = [t.failure for t in out.trajectories if t.failed]
    if policy.on_failure == "drop":
        assert len(out.trajectories) == 1 and out.rewards == [1.25]  # 0.25 on the first turn, 1 at the end
    else:
        assert out.rewards == [1.25, 0.0, 0.0, 0.0, 0.0, 0.0]
        assert "reset() failed: RuntimeError: no start" in failures[0] and "reset() exceeded 0.5s" in failures[1]
        assert "crashed" in failures[2] and "not text" in failures[3] and "not a finite number" in failures[4]
    assert all(env.closed for env in task.made)  # every episode released, failed or not


def test_problems_are_seeded_episodes_with_disjoint_splits():
    task = ScriptTask([""])
    assert task.problems("train") == [{"seed": 0}, {"seed": 1}] and task.problems("test") == [{"seed": 2}]
    from rlkit.errors import ConfigError

    with pytest.raises(ConfigError, match="splits"):
        task.problems("validation")


class Slow(TextEnv):
    def reset(self):
        return TextTurn(observation="wait")

    def step(self, reply):
        time.sleep(1.0)
        return TextTurn(reward=1.0, done=True)


class SlowTask(TextEnvTask):
    name = "slow"

    def make_env(self, problem, policy):
        return Slow()


def test_the_episodes_of_a_group_step_at_once(service, tokenizer):
    """A remote environment's latency is paid once a turn, not G times."""
    task = SlowTask(num_train=1, num_test=0)
    sampler = service.create_sampling_client(base_model="tiny")
    t0 = time.perf_counter()
    out = rollout_group(sampler, task.env_group({"seed": 0}, tokenizer), 4, SamplingParams(max_tokens=2), RolloutPolicy())
    assert out.rewards == [1.0] * 4 and out.reward_seconds >= 4.0
    assert time.perf_counter() - t0 < 3.0
