"""ToolEnv: scripted episodes (deterministic), the SFT demonstration, the collector with a scripted
sampler (multi-turn, reasoning stripped on request), and trained tokens == sampled tokens."""

from __future__ import annotations

import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.chat import plain_tokens
from rlkit.errors import ConfigError
from rlkit.rl.collect import RolloutPolicy, rollout_group
from rlkit.rl.datums import trajectory_datum, trajectory_datums
from rlkit.tasks import build_task
from rlkit.tasks.tools import ToolTask
from rlkit.tools.render import format_call
from rlkit.tools.stability import check_prefix_stability
from rlkit.types import SampledSequence, SampleResponse, SamplingParams, StopReason, TokenUsage

INNER = {
    "name": "arithmetic",
    "ops": ["*"],
    "low": 100,
    "high": 999,
    "num_train": 8,
    "num_test": 4,
    "num_shots": 0,
    "prefill": False,
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture()
def task():
    t = build_task({"name": "tools", "task": INNER, "tools": ["calculator"], "max_tool_calls": 2})
    yield t
    t.close()


def turn(tok, text):
    return plain_tokens(tok, text) + [tok.convert_tokens_to_ids("<|im_end|>")]


def call(expression):
    return format_call("calculator", {"expression": expression})


def test_episode_with_a_tool_call(task, tok):
    problem = task.problems("train")[0]
    a, b, answer = problem["a"], problem["b"], problem["answer"]
    env = task.env_group(problem, tok).make_envs(1)[0]
    prompt = env.initial_observation()
    assert "calculator" in tok.decode(prompt) and tok.decode(prompt).endswith(
        f"What is {a} * {b}?<|im_end|>\n<|im_start|>assistant\n"
    )
    first = turn(tok, call(f"{a} * {b}"))
    r1 = env.step(first)
    assert not r1.done and r1.reward == 0.0 and r1.info["tool_messages"] == [answer]
    assert tok.decode(r1.next_observation) == f"\n<|im_start|>tool\n{answer}<|im_end|>\n<|im_start|>assistant\n"
    r2 = env.step(turn(tok, answer))
    assert r2.done and r2.reward == 1.0
    m = r2.metrics
    assert (m["tool_calls"], m["malformed_calls"], m["tool_errors"], m["turns"], m["used_tool"]) == (1, 0, 0, 2, 1)
    assert (m["correct"], m["correct_with_tool"], m["correct_without_tool"]) == (1.0, 1.0, 0.0)


def test_malformed_calls_errors_and_budget(task, tok):
    problem = task.problems("train")[1]
    env = task.env_group(problem, tok).make_envs(1)[0]
    r1 = env.step(turn(tok, '<tool_call>{"name": "calculator", "arguments": {"expression": "1 +"}'))  # never closed
    assert not r1.done and r1.info["tool_messages"][0].startswith(
        "Error: malformed tool call: tool call 1: '<tool_call>' is never closed"
    )
    r2 = env.step(turn(tok, call("1 / 0")))
    assert r2.info["tool_messages"] == ["Error: division by zero"]
    r3 = env.step(turn(tok, call("2 * 3")))  # budget of 2 calls spent: this turn is graded as the answer
    assert r3.done and r3.reward == 0.0
    assert (
        r3.metrics["malformed_calls"],
        r3.metrics["tool_errors"],
        r3.metrics["tool_calls"],
        r3.metrics["over_budget"],
    ) == (1, 1, 1, 1)
    assert r3.metrics["correct_without_tool"] == 0.0 and r3.metrics["turns"] == 3


def test_direct_answer_and_shaping(tok):
    task = ToolTask(INNER, max_tool_calls=1, call_reward=0.5)
    try:
        problem = task.problems("train")[2]
        env = task.env_group(problem, tok).make_envs(1)[0]
        done = env.step(turn(tok, problem["answer"]))
        assert (
            done.done
            and done.reward == 1.0
            and done.metrics["correct_without_tool"] == 1.0
            and done.metrics["used_tool"] == 0.0
        )
        env = task.env_group(problem, tok).make_envs(1)[0]
        # a well-formed call (the calculator then refuses "1 +") and a malformed one; the budget of 1 runs the first
        env.step(turn(tok, call("1 +") + "<tool_call>x</tool_call>"))
        last = env.step(turn(tok, "0"))  # wrong: reward = 0 + 0.5 * (1 well-formed / 1 attempted)
        assert last.reward == pytest.approx(0.5) and (last.metrics["tool_errors"], last.metrics["over_budget"]) == (
            1,
            1,
        )
    finally:
        task.close()
    with pytest.raises(ConfigError, match="needs messages"):
        ToolTask({"name": "code", "num_train": 1, "num_test": 1})
    with pytest.raises(ConfigError, match=r"task.tools.name='abacus': unknown tool; choose from \['calculator', 'python'\]"):
        ToolTask(INNER, tools=["abacus"])


def test_demonstration_is_what_an_episode_samples(task, tok):
    """The SFT warm start renders the demo conversation; its tokens equal the RL token stream of an
    episode whose turns are the demo's assistant turns, and its weights mark exactly those turns."""
    problem = task.problems("train")[3]
    tokens, weights = task.reference_tokens(problem, tok)
    demo = task.demonstration(problem)
    assert [m["role"] for m in demo] == ["system", "user", "assistant", "tool", "assistant"]
    assert demo[3]["content"] == problem["answer"]  # the real calculator's result
    env = task.env_group(problem, tok).make_envs(1)[0]
    first, second = turn(tok, call(f"{problem['a']} * {problem['b']}")), turn(tok, problem["answer"])
    obs = env.step(first).next_observation
    stream = env.initial_observation() + first + obs + second
    assert tokens[: len(stream)] == stream and len(tokens) - len(stream) <= 1  # the template's trailing newline
    assert [t for t, w in zip(tokens, weights) if w] == first + second
    assert check_prefix_stability(task.renderer(tok), demo).stable


class ScriptedSampler:
    """Returns scripted turns (a unit-test fake next to the real sampler runs below and in the CLI test)."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.calls, self.params = tok, turns, [], []  # list.append: safe from rollout threads

    def sample(self, prompt, num_samples=1, sampling_params=None, **_):
        self.calls.append(prompt.to_ints())
        self.params.append(sampling_params)
        k = self.tok.decode(prompt.to_ints()).count("<|im_start|>tool")  # tool turns so far = this turn's index
        text = self.turns[min(k, len(self.turns) - 1)]
        tokens = turn(self.tok, text)
        seqs = [
            SampledSequence(stop_reason=StopReason.STOP, tokens=tokens, logprobs=[-0.5] * len(tokens))
            for _ in range(num_samples)
        ]

        class _Done:
            def result(self_inner):
                return SampleResponse(
                    sequences=seqs, usage=TokenUsage(prefill_tokens=len(prompt.to_ints()), decode_tokens=len(tokens))
                )

        return _Done()


def trained_tokens(datum):
    w = datum.loss_fn_inputs["weights"].tolist()
    targets = datum.loss_fn_inputs["target_tokens"].tolist()
    return [t for t, x in zip(targets, w) if x]


def test_collector_multi_turn_keeps_sampled_tokens(task, tok):
    problem = task.problems("train")[4]
    sampler = ScriptedSampler(tok, [call(f"{problem['a']} * {problem['b']}"), problem["answer"]])
    group = rollout_group(
        sampler, task.env_group(problem, tok), 3, SamplingParams(max_tokens=64), RolloutPolicy(max_turns=3)
    )
    assert group.rewards == [1.0, 1.0, 1.0]
    for traj in group.trajectories:
        assert len(traj.transitions) == 2 and traj.metrics["tool_calls"] == 1
        datum = trajectory_datum(traj, 1.0, 1.0)
        actions = [tok_ for t in traj.transitions for tok_ in t.action]
        assert trained_tokens(datum) == actions  # every trained token is a sampled token, in order
        assert datum.model_input.to_ints() == traj.tokens
        # the second turn was sampled from exactly prompt + action + observation
        assert (
            sampler.calls[-1]
            == traj.transitions[0].observation + traj.transitions[0].action + traj.transitions[1].observation
        )


def test_strip_reasoning_on_request_trains_each_turn_in_its_context(tok):
    task = ToolTask(INNER, strip_reasoning=True)
    try:
        problem = task.problems("train")[5]
        thought = "<think>the product of two 3-digit numbers</think>"
        sampler = ScriptedSampler(tok, [thought + call(f"{problem['a']} * {problem['b']}"), problem["answer"]])
        group = rollout_group(
            sampler, task.env_group(problem, tok), 2, SamplingParams(max_tokens=64), RolloutPolicy(max_turns=3)
        )
        traj = group.trajectories[0]
        assert group.rewards == [1.0, 1.0] and traj.transitions[1].new_sequence
        second_context = sampler.calls[-1]
        assert "<think>" not in tok.decode(second_context) and "<tool_call>" in tok.decode(second_context)
        datums = trajectory_datums(traj, 1.0, 1.0)
        assert len(datums) == 2 and [d.model_input.to_ints() for d in datums] == traj.sequences
        assert datums[1].model_input.to_ints()[: len(second_context)] == second_context
        assert [trained_tokens(d) for d in datums] == [t.action for t in traj.transitions]
        with pytest.raises(ValueError, match="2 token sequences"):
            trajectory_datum(traj, 1.0)
    finally:
        task.close()


def test_sampled_rollout_on_the_tiny_model(service, task, tok):
    """The real sampler: whatever the random model writes, every trained token is a sampled one."""
    sampler = service.create_sampling_client(base_model="tiny")
    groups = [
        rollout_group(
            sampler,
            task.env_group(p, tok),
            4,
            SamplingParams(max_tokens=24, temperature=1.0),
            RolloutPolicy(max_turns=3),
            seed=3,
        )
        for p in task.problems("train")[:2]
    ]
    for g in groups:
        for traj in g.trajectories:
            for datum, seq in zip(trajectory_datums(traj, 1.0, 1.0), traj.sequences):
                assert datum.model_input.to_ints() == seq
            assert [t for d in trajectory_datums(traj, 1.0) for t in trained_tokens(d)] == [
                x for t in traj.transitions for x in t.action
            ]
            assert "turns" in traj.metrics and "malformed_calls" in traj.metrics


def test_evaluation_gives_each_problem_its_own_seed(task, tok):
    """pass@k with one seed for every request measured one random draw sequence, not n problems (a
    multi-turn episode's later turns all reused it too): each problem gets its own seed."""
    from rlkit.rl.eval import evaluate

    problems = task.problems("test")[:4]
    sampler = ScriptedSampler(tok, [call(f"{p['a']} * {p['b']}") for p in problems[:1]] + ["0"])
    metrics = evaluate(sampler, task, problems, tok, max_tokens=64, pass_k=2, seed=5, policy=RolloutPolicy(max_turns=3))
    sampled = [p.seed for p in sampler.params if p.temperature == 1.0]
    assert len(sampled) == 2 * len(problems) and len(set(sampled)) == len(sampled)  # every problem and turn its own
    assert metrics["eval/greedy/tool_calls"] == 1.0 and metrics["eval/greedy/turns"] == 2.0
