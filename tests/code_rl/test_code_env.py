"""The two-turn code environment: scoring paths with injected programs (deterministic), feedback
rendered through the chat template, and a real sampled two-turn rollout on the tiny model."""

from __future__ import annotations

import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.chat import prompt_tokens
from rlkit.errors import ConfigError, DataError
from rlkit.rl.collect import RolloutPolicy, rollout_group
from rlkit.rl.datums import trajectory_datum
from rlkit.rl.eval import success
from rlkit.tasks import build_task
from rlkit.tasks.code import CodeTask
from rlkit.types import ModelInput, SamplingParams

IM_END = "<|im_end|>"
ADD = {"id": "toy/add", "kind": "stdio", "statement": "Read two integers and print their sum.", "num_public": 1,
       "tests": {"inputs": ["1 2\n", "3 4\n", "10 -20\n"], "outputs": ["3\n", "7\n", "-10\n"]}}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def task():
    t = CodeTask(dataset="mbpp", num_train=4, num_test=3, sandbox_workers=2)
    yield t
    t.close()


def ids(tok, text):
    return list(tok.encode(text, add_special_tokens=False))


def end(tok):
    return ids(tok, IM_END)


def mbpp_problem(task):
    problem = task.problems("test")[0]  # task 11: remove_Occ, 3 asserts, the first one public
    assert problem["id"] == "mbpp/11" and problem["num_public"] == 1 and len(problem["test_list"]) == 3
    return problem


def test_problems_splits_and_public_tests(task):
    assert len(task.problems("train")) == 4 and len(task.problems("test")) == 3
    problem = mbpp_problem(task)
    message = task.user_message(problem)
    assert problem["test_list"][0] in message and problem["test_list"][1] not in message  # hidden stay hidden
    cc = CodeTask(dataset="codecontests", num_test=5)
    try:
        assert len(cc.problems("train")) == 100 and len(cc.problems("test")) == 5
        for p in cc.problems("test"):
            assert p["num_public"] == 1
            first = " ".join(p["tests"]["inputs"][0].split())
            assert first in " ".join(p["statement"].split())  # the public test is the statement's example
        assert {p["id"] for p in cc.problems("train")}.isdisjoint(p["id"] for p in cc.problems("test"))
    finally:
        cc.close()
    assert isinstance(build_task({"name": "code", "num_train": 2, "num_test": 2}), CodeTask)
    with pytest.raises(ConfigError):
        CodeTask(reward="partial")


def test_wrong_then_reference_solution(task, tok):
    problem = mbpp_problem(task)
    group = task.env_group(problem, tok)
    env = group.make_envs(2)[0]
    prompt = env.initial_observation()
    assert prompt == prompt_tokens(tok, task.messages(problem), prefill="```python\n")

    wrong = ids(tok, "def remove_Occ(s, ch):\n    return s\n```") + end(tok)  # turn closed by the model
    first = env.step(wrong)
    assert (first.reward, first.done) == (0.0, False)
    assert first.metrics["turn1_has_code"] == 1.0 and first.metrics["turn1_all_passed"] == 0.0
    assert first.info["public"]["tests"][0]["verdict"] == "wrong_answer" and len(first.info["public"]["tests"]) == 1
    feedback = first.info["feedback"]
    assert "failed 1 of 1 public tests" in feedback and problem["test_list"][0] in feedback
    assert problem["test_list"][1] not in feedback  # hidden tests are never shown
    # rendered through the chat template: the whole context decodes to the template's own text
    convo = task.messages(problem) + [{"role": "assistant", "content": "```python\n" + "def remove_Occ(s, ch):\n    return s\n```"},
                                      {"role": "user", "content": feedback}]
    want = tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True) + "```python\n"
    assert tok.decode(prompt + wrong + first.next_observation) == want
    assert first.next_observation[0] != end(tok)[0]  # the model's own <|im_end|> is not repeated

    second = env.step(ids(tok, problem["reference"] + "\n```") + end(tok))
    assert (second.reward, second.done) == (1.0, True)
    m = second.metrics
    assert m["all_passed"] == m["pass_fraction"] == m["has_code"] == 1.0 and m["turns"] == 2.0
    assert m["turn1_all_passed"] == 0.0 and m["timeout_fraction"] == 0.0
    assert [c["verdict"] for c in second.info["hidden"]["tests"]] == ["passed"] * 3


def test_reference_completion_follows_the_prefill_and_passes_the_hidden_tests(task, tok):
    """The SFT baseline's target: prompt (ending in the prefill) + reference completion is a whole
    answer whose program the env grades as correct; datasets without solutions say so."""

    problem = mbpp_problem(task)
    completion = task.reference_completion(problem)
    assert completion == problem["reference"].strip() + "\n```" and task.has_references
    env = task.env_group(problem, tok).make_envs(1)[0]
    env.initial_observation()
    first = env.step(ids(tok, completion) + end(tok))
    assert first.metrics["turn1_all_passed"] == 1.0  # all hidden tests (grade_every_turn)
    assert [c["verdict"] for c in first.info["public"]["tests"]] == ["passed"]

    bare = CodeTask(dataset="mbpp", num_train=1, num_test=1, prefill="")
    assert bare.reference_completion(bare.problems("train")[0]).startswith("```python\n")
    cc = CodeTask(dataset="codecontests", num_train=1, num_test=1)
    assert not cc.has_references
    with pytest.raises(DataError, match="no reference program"):
        cc.reference_completion(cc.problems("test")[0])


def test_public_pass_hidden_fail_and_partial_credit(tok):
    task = CodeTask(dataset="mbpp", num_train=1, num_test=1, reward="pass_fraction", sandbox_workers=1)
    try:
        problem = task.problems("test")[0]
        hardcoded = ids(tok, 'def remove_Occ(s, ch):\n    return "heo"\n```')  # only the public test passes
        env = task.env_group(problem, tok).make_envs(1)[0]
        first = env.step(hardcoded)  # stopped at the fence: no <|im_end|>, the env closes the turn
        assert first.next_observation[: len(end(tok))] == end(tok)
        assert first.metrics["turn1_public_pass_fraction"] == 1.0 and first.metrics["turn1_pass_fraction"] == pytest.approx(1 / 3)
        assert first.info["feedback"].startswith("All public tests passed.")
        second = env.step(hardcoded)
        assert second.done and second.reward == pytest.approx(1 / 3)
        assert second.metrics["all_passed"] == 0.0 and second.metrics["public_pass_fraction"] == 1.0
    finally:
        task.close()


def test_stdio_feedback_no_code_turn_and_single_turn(tok):
    task = CodeTask(dataset="mbpp", num_train=1, num_test=1, prefill="", sandbox_workers=1)
    try:
        env = task.env_group(ADD, tok).make_envs(1)[0]
        wrong = env.step(ids(tok, "Here:\n```python\na, b = map(int, input().split())\nprint(a - b)\n```") + end(tok))
        fb = wrong.info["feedback"]
        assert "Test 1: wrong answer" in fb and "Input:\n1 2" in fb and "Expected output:\n3" in fb and "Your output:\n-1" in fb
        assert "10 -20" not in fb  # hidden input
        final = env.step(ids(tok, "I think it is right.") + end(tok))  # no code: the previous program is graded
        assert final.done and final.reward == 0.0 and final.info["graded_previous_program"] is True
        assert final.metrics["has_code"] == 1.0 and final.metrics["pass_fraction"] == 0.0

        env = task.env_group(ADD, tok).make_envs(1)[0]
        none = env.step(ids(tok, "No idea.") + end(tok))
        assert not none.done and "no ```python code block" in none.info["feedback"] and none.metrics["turn1_has_code"] == 0.0
        right = env.step(ids(tok, "```python\nimport sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b, '  ')\n```"))
        assert right.reward == 1.0 and right.metrics["all_passed"] == 1.0  # trailing whitespace is ignored

        one = CodeTask(dataset="mbpp", num_train=1, num_test=1, turns=1, prefill="", sandbox_workers=1)
        try:
            res = one.env_group(ADD, tok).make_envs(1)[0].step(ids(tok, "```python\nprint(sum(map(int, input().split())))\n```"))
            assert res.done and res.reward == 1.0 and res.metrics["turns"] == 1.0
        finally:
            one.close()
    finally:
        task.close()


def test_stop_on_pass_ends_early(tok):
    task = CodeTask(dataset="mbpp", num_train=1, num_test=1, prefill="", stop_on_pass=True, sandbox_workers=1)
    try:
        env = task.env_group(ADD, tok).make_envs(1)[0]
        res = env.step(ids(tok, "```python\nprint(sum(map(int, input().split())))\n```"))
        assert res.done and res.reward == 1.0 and res.metrics["turns"] == 1.0
        assert res.metrics["turn1_all_passed"] == 1.0 and res.metrics["turn1_public_pass_fraction"] == 1.0
        env = task.env_group(ADD, tok).make_envs(1)[0]
        res = env.step(ids(tok, "```python\nprint(0)\n```"))  # fails the public test: a second turn
        assert not res.done and "Test 1: wrong answer" in res.info["feedback"]
    finally:
        task.close()


def test_sampled_two_turn_rollout_keeps_tokens(service, task):
    sampler = service.create_sampling_client(base_model="tiny")
    tok = sampler.get_tokenizer()
    problem = mbpp_problem(task)
    group = task.env_group(problem, tok)
    params = SamplingParams(max_tokens=10, temperature=1.0)
    out = rollout_group(sampler, group, 3, params, RolloutPolicy(max_turns=2, timeout_s=60), seed=5)
    direct = sampler.sample(ModelInput.from_ints(group.prompt), num_samples=3,
                            sampling_params=params.model_copy(update={"seed": 5})).result()
    assert [t.transitions[0].action for t in out.trajectories] == [list(s.tokens) for s in direct.sequences]
    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8)
    try:
        for traj, reward in zip(out.trajectories, out.rewards):
            assert len(traj.transitions) == 2 and not traj.failed
            t1, t2 = traj.transitions
            assert t1.observation == group.prompt and not t1.done and t2.done
            assert t1.info["feedback"] and t2.observation[-len(ids(tok, "```python\n")):] == ids(tok, "```python\n")
            assert t2.observation == group.make_envs(1)[0]._next_observation(t1.action, t1.info["feedback"])
            assert traj.tokens == group.prompt + t1.action + t2.observation + t2.action
            assert reward == t2.reward and {"all_passed", "pass_fraction", "has_code", "timeout_fraction",
                                            "turn1_has_code"} <= set(traj.metrics)
            assert success(traj, reward) == bool(traj.metrics["all_passed"])
            datum = trajectory_datum(traj, advantage=1.0, temperature=1.0)
            w = datum.loss_fn_inputs["weights"].tolist()
            n_obs1 = len(t1.observation)
            span2 = n_obs1 + len(t1.action) + len(t2.observation)
            assert sum(w) == len(t1.action) + len(t2.action)
            assert w[n_obs1 - 1: n_obs1 - 1 + len(t1.action)] == [1.0] * len(t1.action)
            assert w[span2 - 1: span2 - 1 + len(t2.action)] == [1.0] * len(t2.action)
            lp = trainer.forward([datum], "ppo").result().loss_fn_outputs[0]["logprobs"].tolist()
            sampled = datum.loss_fn_inputs["logprobs"].tolist()
            for i, wi in enumerate(w):
                if wi:
                    assert lp[i] == pytest.approx(sampled[i], abs=1e-4)  # both turns scored as sampled
    finally:
        trainer.stop()


def test_hub_rows_real_public_split_and_offline_fallback(monkeypatch, caplog):
    import datasets

    rows = [{"name": f"p{i}", "description": f"Print {i}.\n\nExample\n\nInput\n\n{i}\n", "time_limit": {"seconds": 1, "nanos": 0},
             "public_tests": {"input": [f"{i}\n", f"{i} {i}\n"], "output": [f"{i}\n", f"{i}\n"]},
             "private_tests": {"input": ["7\n"], "output": ["7\n"]}, "generated_tests": {"input": [], "output": []}}
            for i in range(3)]
    calls = []

    def fake_load(hf_id, config=None, split=None):
        calls.append((hf_id, config, split))
        if hf_id != "deepmind/code_contests":
            raise ConnectionError("offline")
        return rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    task = CodeTask(dataset="codecontests", train={"hf_id": "deepmind/code_contests", "split": "train"},
                    test={"hf_id": "deepmind/code_contests", "split": "test", "limit": 2})
    assert calls == [("deepmind/code_contests", None, "train"), ("deepmind/code_contests", None, "test")]
    assert len(task.problems("train")) == 3 and len(task.problems("test")) == 2  # no local start/limit applied
    p = task.problems("train")[1]
    assert p["id"] == "codecontests/p1" and p["num_public"] == 2 and p["tests"]["inputs"] == ["1\n", "1 1\n", "7\n"]
    with caplog.at_level("WARNING"):
        fallback = CodeTask(dataset="mbpp", train={"hf_id": "nope/mbpp"}, num_train=2, num_test=1)
    assert "unavailable" in caplog.text and [q["id"] for q in fallback.problems("train")] == ["mbpp/601", "mbpp/602"]
    subset = CodeTask(dataset="mbpp", train={"ids": ["mbpp/700", "mbpp/650"]}, num_test=1)
    assert [q["id"] for q in subset.problems("train")] == ["mbpp/700", "mbpp/650"]


def test_sources_keyed_by_dataset_apply_only_to_the_chosen_one():
    from rlkit.errors import ConfigError
    from rlkit.tasks.code import source_for

    keyed = {"mbpp": {"ids": ["mbpp/700"]}, "codecontests": {"start": 70}}
    assert source_for("mbpp", "train", keyed) == {"ids": ["mbpp/700"]}
    assert source_for("codecontests", "train", keyed) == {"start": 70}
    assert source_for("codecontests", "train", {"mbpp": {"ids": ["mbpp/700"]}}) == {}  # the defaults of the chosen one
    assert source_for("codecontests", "train", {"start": 70}) == {"start": 70}  # plain keys: whichever runs
    with pytest.raises(ConfigError, match=r"^task.train.mbpp: unknown keys \['idz'\]"):  # a typo in any block
        source_for("codecontests", "train", {"mbpp": {"idz": []}})
    with pytest.raises(ConfigError, match="not both"):
        source_for("mbpp", "test", {"mbpp": {}, "limit": 3})
    # the recipe's MBPP ids do not follow a switch to CodeContests: its own training split loads
    cc = CodeTask(dataset="codecontests", train={"mbpp": {"ids": ["mbpp/700", "mbpp/650"]}}, num_train=2, num_test=1)
    assert len(cc.problems("train")) == 2 and all(q["id"].startswith("codecontests/") for q in cc.problems("train"))
