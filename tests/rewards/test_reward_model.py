"""A sequence-classification reward model scored locally in batches (a tiny random
LlamaForSequenceClassification built here), and the ``scored`` task scoring a group with it."""

import pytest
import torch

from rlkit.errors import ConfigError
from rlkit.rewards.reward_model import RewardModel


@pytest.fixture(scope="module")
def tiny_rm():
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rlkit.backends.local.models import load_tokenizer

    tok = load_tokenizer("tiny")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    return LlamaForSequenceClassification(config).eval(), tok


def test_batched_scores_equal_one_by_one_and_the_models_own_logit(tiny_rm):
    model, tok = tiny_rm
    rm = RewardModel(model, tok, batch_size=3)
    pairs = [("What is 2+2?", "4"), ("What is 2+2?", "four, I believe, after long thought"), ("Hi", "hello there"), ("Q", "")]
    batched = rm.score(pairs)
    single = [RewardModel(model, tok, batch_size=1).score([p])[0] for p in pairs]
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(s, 6) for s in batched)) > 1  # different texts, different scores
    ids = torch.tensor([rm.encode(*pairs[1])])
    with torch.no_grad():
        assert batched[1] == pytest.approx(float(model(input_ids=ids).logits[0, 0]), abs=1e-5)
    calls = []
    original = model.forward
    model.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        rm.score(pairs)
    finally:
        model.forward = original
    assert len(calls) <= 2  # 4 pairs in batches of 3 (the head is applied by rlkit, the body is one call per batch)


def test_sigmoid_and_the_reward_protocol(tiny_rm):
    model, tok = tiny_rm
    raw = RewardModel(model, tok)(" 4", {"question": "2+2?"})
    squashed = RewardModel(model, tok, normalize="sigmoid")(" 4", {"question": "2+2?"})
    assert squashed.reward == pytest.approx(float(torch.sigmoid(torch.tensor(raw.reward))))
    assert raw.metrics["reward_model/score"] == raw.reward
    with pytest.raises(ConfigError, match="label"):
        RewardModel(model, tok, label=3)
    with pytest.raises(ConfigError, match="normalize"):
        RewardModel(model, tok, normalize="tanh")


def test_scored_task_scores_a_group_in_one_batch(tiny_rm):
    from rlkit.backends.local.models import load_tokenizer
    from rlkit.tasks.base import Trajectory, Transition
    from rlkit.tasks.scored import ScoredTask

    model, tok = tiny_rm
    rm = RewardModel(model, tok)
    seen = []
    original = rm.score
    rm.score = lambda pairs: seen.append(len(pairs)) or original(pairs)
    task = ScoredTask(task={"name": "arithmetic", "num_train": 4, "num_test": 1}, reward=rm, task_weight=1.0)
    tokenizer = load_tokenizer("tiny")
    problem = task.problems("train")[0]
    group = task.env_group(problem, tokenizer)
    envs = group.make_envs(3)
    actions = [tokenizer.encode(f" {problem['answer']}"), tokenizer.encode(" 1"), tokenizer.encode(" 2")]
    trajs = []
    for env, action in zip(envs, actions):
        result = env.step(action)
        trajs.append(Trajectory([Transition(observation=env.initial_observation(), action=action, action_logprobs=[], reward=result.reward)]))
    rewards = group.score_group(trajs)
    assert seen == [3]  # one call for the whole group
    expected = original([(problem["question"], tokenizer.decode(a, skip_special_tokens=True)) for a in actions])
    assert rewards == pytest.approx([1.0 + expected[0], expected[1], expected[2]])
    assert trajs[0].metrics["reward_model/score"] == pytest.approx(expected[0])
