"""verifiers environments (verifiers 0.4.0) as rlkit tasks, the mapping piece by piece: taskset rows
-> problems (train / held-out test), one verifiers episode per rollout with its model at rlkit's
rollout endpoint (exact prompt tokens: the model's chat template over the harness's messages), the
rubric -> reward (weighted sum) with each reward's score as a metric, a multi-turn env's responses
continuing the token sequence, a tool call running through verifiers' own MCP tool server, the bash
harness in the rollout's folder, a raising rubric failing its episode only (counted), and every bad
input as one ConfigError line before any model loads.

Needs verifiers importable: ``pip install 'rlkit[verifiers]'``; with the dev install it lives in
.venv/site-verifiers and tests/envs/test_verifiers_site.py runs this file there."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

vf = pytest.importorskip("verifiers.v1", reason="the verifiers extra (dev: .venv/site-verifiers, run by test_verifiers_site.py)")

from rlkit.backends.local.models import load_tokenizer  # noqa: E402
from rlkit.chat import prompt_tokens  # noqa: E402
from rlkit.errors import ConfigError  # noqa: E402
from rlkit.futures import APIFuture  # noqa: E402
from rlkit.rl.collect import RolloutPolicy, collect_groups  # noqa: E402
from rlkit.rl.verifiers_agent import VerifiersTask  # noqa: E402
from rlkit.serve.rollouts import RolloutEndpoint  # noqa: E402
from rlkit.tasks.envs.verifiers_task import VerifiersEnvTask, episode_outcome, split_tasks  # noqa: E402
from rlkit.tools.render import format_call  # noqa: E402
from rlkit.types import SampledSequence, SampleResponse, SamplingParams, StopReason, TokenUsage  # noqa: E402

HERE = Path(__file__).parent
PARAMS = SamplingParams(max_tokens=64, temperature=1.0)


@pytest.fixture(autouse=True)
def user_folder(monkeypatch):
    """The tests' environments (vf_*.py) are the user's modules in the working directory."""
    monkeypatch.chdir(HERE)
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", __import__("os").environ.get("PYTHONPATH", ""))  # restored after the test


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def endpoint():
    ep = RolloutEndpoint().start()
    yield ep
    ep.stop()


class Scripted:
    """A sampling client that answers ``reply(prompt text)`` (then end of turn), recording the prompts."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.prompts = tokenizer, reply, []

    def get_tokenizer(self):
        return self.tokenizer

    def sample(self, prompt, num_samples=1, sampling_params=None, **_):
        ids = prompt if isinstance(prompt, list) else prompt.to_ints()
        text = self.tokenizer.decode(ids)
        self.prompts.append(text)
        tokens = list(self.tokenizer.encode(self.reply(text), add_special_tokens=False))
        tokens.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        seq = SampledSequence(stop_reason=StopReason.STOP, tokens=tokens, logprobs=[-0.5] * len(tokens))
        return APIFuture.completed(SampleResponse(sequences=[seq] * num_samples,
                                                  usage=TokenUsage(prefill_tokens=len(ids), decode_tokens=len(tokens))))


def run_episode(task, problem, sampler, endpoint):
    episode = endpoint.open(sampler, PARAMS)
    try:
        result = task.run(problem, base_url=endpoint.base_url, model=episode)
    finally:
        record = endpoint.close(episode)
    return result, record


def last_user_turn(text):
    return text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0]


def test_a_single_turn_episode_is_scored_by_its_rubric(tok, endpoint):
    task = VerifiersEnvTask(env="vf_word:load_environment", num_train=4, num_test=2)
    try:
        train, test = task.problems("train"), task.problems("test")
        assert [p["index"] for p in train] == [0, 1, 2, 3] and [p["index"] for p in test] == [0, 1]
        assert train[0]["prompt"] == "Say a word with the letter a." and test[0]["prompt"].endswith("letter e.")
        messages = task.messages(train[0])
        assert messages == [{"role": "system", "content": "Answer in one word."},
                            {"role": "user", "content": "Say a word with the letter a."}]
        result, record = run_episode(task, train[0], Scripted(tok, lambda _: "apple"), endpoint)
        assert result.reward == 1.5  # has_letter 1 + 0.5 x short 1: verifiers' weighted sum
        assert result.metrics == {"verifiers/has_letter": 1.0, "verifiers/short": 1.0, "verifiers/metric/words": 1.0,
                                  "verifiers/turns": 1.0}
        assert len(record.calls) == 1 and record.calls[0].prompt == prompt_tokens(tok, messages)  # the model's own template
        result, _ = run_episode(task, train[1], Scripted(tok, lambda _: "blah blah blah blah blah"), endpoint)
        assert result.reward == 0.0 and result.metrics["verifiers/metric/words"] == 5.0
    finally:
        task.close()


def test_a_multi_turn_envs_responses_continue_the_token_sequence(tok, endpoint):
    task = VerifiersEnvTask(env="vf_guess:load_environment", num_train=2)
    try:
        problem = task.problems("train")[0]  # the number is 1
        sampler = Scripted(tok, lambda text: "1" if last_user_turn(text) == "Lower." else "5")
        result, record = run_episode(task, problem, sampler, endpoint)
        assert result.reward == 1.0 and result.metrics["verifiers/turns"] == 2.0
        traj = record.trajectory()
        assert [t.new_sequence for t in traj.transitions] == [False, False]  # one sequence: the env's turn appended
        assert "<|im_start|>user\nLower.<|im_end|>" in tok.decode(traj.transitions[1].observation)
        assert traj.sequences == [record.calls[1].prompt + record.calls[1].tokens]
        result, record = run_episode(task, problem, Scripted(tok, lambda _: "9"), endpoint)
        assert result.reward == 0.0 and len(record.calls) == 3  # three tries, all wrong
    finally:
        task.close()


def test_a_tool_call_runs_through_verifiers_own_tool_server(tok, endpoint):
    task = VerifiersEnvTask(env="vf_calc:load_environment", num_train=2)
    try:
        problem = task.problems("train")[1]  # 1 + 3

        def reply(text):
            if "<|im_start|>tool" in text:
                return "The answer is 4."
            return format_call("calc_add", {"a": 1, "b": 3})

        sampler = Scripted(tok, reply)
        result, record = run_episode(task, problem, sampler, endpoint)
        assert result.reward == 1.0 and len(record.calls) == 2
        assert "calc_add" in sampler.prompts[0]  # the tool's schema in the first prompt
        assert re.search(r"<\|im_start\|>tool\n.*4", sampler.prompts[1], re.DOTALL)  # its result before the answer
    finally:
        task.close()


def test_the_bash_harness_runs_commands_in_the_rollouts_folder(tok, endpoint, tmp_path):
    task = VerifiersEnvTask(env="vf_word:load_environment", env_args={"harness": "bash"}, num_train=1)
    try:
        sampler = Scripted(tok, lambda text: "done" if "<|im_start|>tool" in text else format_call("bash", {"command": "pwd"}))
        result, record = run_episode(task, task.problems("train")[0], sampler, endpoint)
        assert len(record.calls) == 2 and "You are a coding agent" in sampler.prompts[0]  # verifiers' bash harness prompt
        folder = sampler.prompts[1].rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0].strip()
        assert "runtimes/subprocess" in folder and not folder.startswith(str(HERE))  # not rlkit's working directory
    finally:
        task.close()


def test_a_raising_rubric_fails_its_episode_only_and_is_counted(tok):
    task = VerifiersTask(env="vf_flaky:load_environment", num_train=4, timeout_s=60)
    try:
        groups = [task.env_group(p, tok) for p in task.problems("train")[:2]]
        got = collect_groups(Scripted(tok, lambda _: "a"), groups, 2, PARAMS, RolloutPolicy(on_failure="zero"), concurrency=2)
        assert [g.failed for g in got] == [0, 2] and got[0].rewards == [1.0, 1.0] and got[1].rewards == [0.0, 0.0]
        failed = got[1].trajectories[0]
        assert failed.failed and "the rubric crashed" in failed.failure and failed.metrics["agent/failed"] == 1.0
        assert got[0].trajectories[0].metrics["verifiers/flaky"] == 1.0 and got[0].trajectories[0].transitions[-1].reward == 1.0
    finally:
        task.close()


def test_the_shipped_example_and_an_env_id_load():
    task = VerifiersEnvTask(env="rlkit.tasks.envs.verifiers_examples:load_environment", num_train=8, num_test=2)
    try:
        assert len(task.problems("train")) == 8 and task.problems("test")[0]["prompt"].startswith("Write one word")
    finally:
        task.close()
    by_id = VerifiersEnvTask(env_id="vf_word", env_args={"agent": {"harness": {"id": "null"}}})  # all 12 tasks: all train
    try:
        assert len(by_id.problems("train")) == 12 and by_id.problems("test") == []
    finally:
        by_id.close()


def test_the_one_word_example_holds_the_reply_to_one_word_with_the_letter():
    """The measured recipe's taskset (verifiers_one_word_grpo): 26 letters x 3 phrasings, split as
    configured, and a reward that a sentence, a bare letter or two words do not get."""
    from rlkit.tasks.envs.verifiers_examples import one_word

    assert [one_word(r) for r in ("Lemon.", ' "Apple" ', "quartz!", "N.", "ox", "The word lemon", "two words")] == \
        ["lemon", "apple", "quartz", "", "", "", ""]
    task = VerifiersEnvTask(env="rlkit.tasks.envs.verifiers_examples:load_one_word_environment", num_train=54, num_test=24)
    try:
        prompts = [p["prompt"] for p in task.problems("train") + task.problems("test")]
        assert len(prompts) == 78 == len(set(prompts)) and len(task.problems("test")) == 24
        assert {m.group(1) for m in (re.search(r"letter (\w)", p) for p in prompts) if m} == set("abcdefghijklmnopqrstuvwxyz")
    finally:
        task.close()


def test_splits_of_finite_and_infinite_tasksets():
    tasks = list(range(10))
    finite = type("Finite", (), {"bounded": True, "__iter__": lambda self: iter(tasks)})()
    assert split_tasks(finite, None, 3) == {"train": tasks[:7], "test": tasks[7:]}
    assert split_tasks(finite, 4, 2) == {"train": tasks[:4], "test": tasks[4:6]}
    infinite = type("Endless", (), {"bounded": False, "__iter__": lambda self: iter(range(10 ** 9))})()
    assert split_tasks(infinite, 2, 1) == {"train": [0, 1], "test": [2]}
    with pytest.raises(ConfigError, match="Endless is infinite; set how many"):
        split_tasks(infinite, None, 0)
    with pytest.raises(ConfigError, match="none left to train on"):
        split_tasks(finite, None, 10)


def _trace(model, reward, trainable=True, name="agent", metrics=None):
    return SimpleNamespace(agent=SimpleNamespace(config=SimpleNamespace(model=model), trainable=trainable, name=name),
                           rewards={"r": vf.Reward(score=reward, weight=2.0)}, metrics=metrics or {}, reward=2.0 * reward,
                           num_turns=1, stop_condition="agent_completed", last_reply="x", errors=[])


def test_episode_outcome_maps_traces_to_one_reward():
    ok = SimpleNamespace(ok=True, last_error=None, traces=[_trace("e1", 1.0), _trace("e1", 0.0, name="b"),
                                                           _trace("judge-model", 1.0, name="judge")])
    result = episode_outcome(ok, "e1")  # the policy's two traces; the judge's (own model) is not the policy
    assert result.reward == 1.0 and result.metrics == {"verifiers/r": 0.5, "verifiers/turns": 1.0}
    frozen = SimpleNamespace(ok=True, last_error=None, traces=[_trace("e1", 1.0), _trace("e1", 1.0, trainable=False, name="user")])
    with pytest.raises(RuntimeError, match="seat 'user' is marked untrainable but plays the run's model"):
        episode_outcome(frozen, "e1")
    failed = SimpleNamespace(ok=False, last_error=SimpleNamespace(type="EnvError", message="GuessEnv.run()\nboom"), traces=[])
    with pytest.raises(RuntimeError, match="episode failed: EnvError: GuessEnv.run\\(\\) boom"):
        episode_outcome(failed, "e1")


BAD = [
    ({}, "give exactly one of env=module:function"),
    ({"env": "vf_word:load_environment", "env_id": "vf_word"}, "give exactly one of"),
    ({"env": "no_such_module:load_environment"}, "cannot import module 'no_such_module'"),
    ({"env": "vf_word:nope"}, "nope"),
    ({"env": "vf_word:NOT_CALLABLE"}, "vf_word:NOT_CALLABLE is a int, not a function returning a verifiers environment"),
    ({"env": "vf_word:not_an_env"}, "vf_word:not_an_env returned dict, not a verifiers environment"),
    ({"env": "vf_word:a_taskset"}, "returned WordTaskset, not a verifiers environment (verifiers.v1.Env); wrap it: return "
                                   "vf.load_environment(vf.resolve_env_config({'taskset': {'id': 'vf_word'}}))"),
    ({"env": "vf_word:raising"}, "vf_word:raising() raised ValueError: no such dataset"),
    ({"env": "vf_word:load_environment", "env_args": {"nope": 1}}, "load_environment(nope) raised TypeError"),
    ({"env": "vf_word:ENV", "env_args": {"x": 1}}, "vf_word:ENV is an environment, not a function"),
    ({"env": "vf_word:codex"}, "seat 'agent' plays verifiers' 'codex' harness"),
    ({"env_id": "no_such_taskset"}, "train.task.env_id=no_such_taskset: ModuleNotFoundError: taskset 'no_such_taskset' not found"),
    ({"env": "vf_word:load_environment", "num_train": 0}, "num_train=0 must be >= 1"),
]


@pytest.mark.parametrize("options, line", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_one_line_before_any_model_loads(options, line):
    with pytest.raises(ConfigError) as info:
        VerifiersTask.check_options(options)
    assert line in str(info.value) and "\n" not in str(info.value)


def test_without_verifiers_the_line_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ConfigError, match=r"needs the verifiers package \(verifiers==0.4.0\): install the verifiers extra: "
                                          r"pip install 'rlkit\[verifiers\]'"):
        VerifiersTask.check_options({"env": "vf_word:load_environment"})


def test_verifiers_runs_on_its_own_openai_2():
    """verifiers 0.4.0 requires openai<3: wherever it is importable, rlkit's openai-using code runs on 2.x
    (test_verifiers_site.py runs the judge's and the rollout endpoint's tests here too)."""
    import openai

    assert openai.__version__.startswith("2."), openai.__version__
