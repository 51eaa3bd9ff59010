"""The ``rlkit`` lm-eval model gives lm-eval's own ``hf`` model's numbers on the same weights (fp32):
loglikelihoods within 1e-4 nats with the same ``is_greedy``, identical greedy generations, and
identical GSM8K scores and filtered answers (limit 4, 5-shot, lm-eval's own task config and
rlkit's copy of the data; prompts of the tiny tokenizer run past the 2,048-token window, so left
truncation is compared too)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # two models, lm-eval run twice: > 5 s

PROMPTS = ["Question: Natalia sold 48 clips. How many?\nAnswer:", "Once upon a time", "def add(a, b):", "The answer is "]


@pytest.fixture(scope="module")
def models(hf_model_dir):
    from lm_eval.models.huggingface import HFLM

    from rlkit.harness.model import RlkitLM

    hf = HFLM(pretrained=str(hf_model_dir), dtype="float32", batch_size=4, device="cpu")
    rl = RlkitLM(model=str(hf_model_dir), precision="fp32")
    yield hf, rl
    rl.close()


def instances(kind, args):
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def greedy_continuation(rl, context, n=3):
    """``n`` greedy tokens after ``context`` as text, when the text tokenises back to them."""
    from rlkit.types import SamplingParams

    ids = rl.tok_encode(context)
    tokens = rl.client.sample(ids, 1, SamplingParams(max_tokens=n, temperature=0.0), stop_token_ids=[]).result().sequences[0].tokens
    text = rl.tok_decode(tokens)
    return text if rl.tok_encode(context + text)[len(ids):] == tokens else None


def test_loglikelihoods_and_is_greedy_match(models):
    hf, rl = models
    pairs = [("Question: what is 2+2?\nAnswer:", " 4"), ("Hello", " world, how are you"), ("", "a continuation with no context"),
             ("The cat sat on the ", "mat."), ("x" * 3000, " truncated from the left")]  # 3000 tokens > max_length: windowed
    greedy = [(p, c) for p in PROMPTS if (c := greedy_continuation(rl, p))]
    assert greedy, "no greedy continuation tokenises back to itself"
    requests = instances("loglikelihood", pairs + greedy)
    ours, theirs = rl.loglikelihood(requests), hf.loglikelihood(requests)
    assert max(abs(a[0] - b[0]) for a, b in zip(ours, theirs)) < 1e-4
    assert [a[1] for a in ours] == [b[1] for b in theirs]
    assert any(a[1] for a in ours[len(pairs):])  # the greedy continuations are greedy for both


def test_loglikelihood_rolling_matches(models):
    hf, rl = models
    requests = instances("loglikelihood_rolling", [("some text " * 400,), ("short",)])  # the first spans two windows
    for a, b in zip(rl.loglikelihood_rolling(requests), hf.loglikelihood_rolling(requests)):
        assert abs(a - b) < 1e-4 + 1e-7 * abs(b)  # hf sums each 2,048-token window in fp32: its own rounding


def test_greedy_generations_identical(models):
    hf, rl = models
    requests = instances("generate_until", [(p, {"until": ["\n\n", "Question:"], "do_sample": False, "max_gen_toks": 40}) for p in PROMPTS])
    ours, theirs = rl.generate_until(requests), hf.generate_until(requests)
    assert ours == theirs
    assert len(set(ours)) == len(ours) and all(len(set(text)) > 3 for text in ours)  # varied text, not one token repeated


def test_gsm8k_scores_identical(models, catalog, offline):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from rlkit.harness import tasks

    hf, rl = models
    runs = []
    for lm in (rl, hf):
        built = tasks.build(catalog, tasks.select(catalog, ["gsm8k"]), online=False)
        # lm-eval's gsm8k as configured, but 64 new tokens instead of 256 (a random model never says "Question:")
        runs.append(lm_eval.simple_evaluate(model=lm, tasks=built, limit=4, bootstrap_iters=0, log_samples=True,
                                            gen_kwargs={"max_gen_toks": 64}, task_manager=TaskManager(include_defaults=False)))
    ours, theirs = runs
    metrics = {k: v for k, v in ours["results"]["gsm8k"].items() if "," in k}
    assert metrics and metrics == {k: v for k, v in theirs["results"]["gsm8k"].items() if "," in k}
    assert [s["filtered_resps"] for s in ours["samples"]["gsm8k"]] == [s["filtered_resps"] for s in theirs["samples"]["gsm8k"]]
    assert [s["resps"] for s in ours["samples"]["gsm8k"]] == [s["resps"] for s in theirs["samples"]["gsm8k"]]
    assert ours["samples"]["gsm8k"][0]["doc"]["question"].startswith("Janet")  # the test split's first item, in order


def test_scoring_window_is_one_longer_than_the_context(models):
    """lm-eval scores ``max_length + 1`` tokens (the last only a target): the engine takes exactly that."""
    from rlkit.errors import InvalidInputError

    _, rl = models
    n = rl.client.max_positions
    values = rl.client.compute_logprobs([5] * (n + 1)).result()
    assert len(values) == n + 1 and values[0] is None and all(v is not None for v in values[1:])
    with pytest.raises(InvalidInputError, match="one more"):
        rl.client.compute_logprobs([5] * (n + 2))


def test_chat_template_as_hf_applies_it(models):
    hf, rl = models
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
               {"role": "user", "content": "3+3?"}]
    for prompt in (True, False):
        assert rl.apply_chat_template(history, add_generation_prompt=prompt) == hf.apply_chat_template(history, add_generation_prompt=prompt)
    assert rl.chat_template(True) == hf.chat_template(True) and rl.tokenizer_name == hf.tokenizer_name
