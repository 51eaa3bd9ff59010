"""DPO: pairs through the loop's data path (render -> reference logprobs -> datums) and the loss and
metrics on hand-computed logprobs; bad pairs refused with their row; the GSM8K pair transform."""

import math

import pytest
import torch

from rlkit.backends.local.models import load_tokenizer
from rlkit.errors import DataError
from rlkit.loops.dpo import PairFormatConfig, ReferenceCache, dpo_metrics, pair_datums
from rlkit.loops.pairs import PairSet, gsm8k_preference_pair, gsm8k_preference_pair_consistent, load_pairs
from rlkit.losses import DPO, run_loss
from rlkit.losses.aggregation import Aggregated
from rlkit.losses.execute import cross_entropy_view
from rlkit.rewards.math import extract_answer

REF_LP = -1.0  # the fake reference's logprob of every token


class Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class FakeReference:
    """compute_logprobs -> [None, -1, -1, ...]; counts calls per token sequence."""

    def __init__(self):
        self.calls = []

    def compute_logprobs(self, tokens):
        self.calls.append(tuple(tokens))
        return Done([None] + [REF_LP] * (len(tokens) - 1))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


RECORDS = [
    {"prompt": "What is 2 + 2?", "chosen": "2 + 2 = 4", "rejected": "2 + 2 = 5"},
    {"prompt": [{"role": "user", "content": "Name a colour."}], "chosen": "Blue.", "rejected": "Seven, probably, or a chair."},
]
WHERE = ["pairs.jsonl:1", "pairs.jsonl:2"]


def pairset(tokenizer, records=RECORDS, where=WHERE):
    fmt = PairFormatConfig()
    return PairSet(load_pairs(records, where, fmt), where, tokenizer, fmt.max_length)


def test_pairs_render_through_the_chat_template_with_weights_on_the_response_only(tokenizer):
    pairs = pairset(tokenizer)
    (c_tokens, c_w), (r_tokens, r_w) = pairs.get(0)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    assert c_tokens[: len(prompt)] == prompt and r_tokens[: len(prompt)] == prompt
    assert not any(c_w[: len(prompt)]) and all(c_w[len(prompt):])
    assert tokenizer.decode(c_tokens[len(prompt):]).startswith("2 + 2 = 4<|im_end|>")
    assert c_tokens != r_tokens


def test_dpo_loss_and_metrics_equal_the_hand_computed_values(tokenizer):
    """Reference logprob -1 per token; policy -0.5 per chosen token and -1.5 per rejected token, so
    log-ratio sums are +0.5 n_c and -0.5 n_r and every quantity has a closed form."""
    pairs = pairset(tokenizer)
    reference = ReferenceCache(FakeReference())
    datums = pair_datums(pairs, [0, 1], reference, "train")
    assert len(datums) == 4
    counts = [int(sum(1 for w in d.loss_fn_inputs["weights"].to_torch().tolist() if w)) for d in datums]
    for d in datums:  # the reference input is the shifted compute_logprobs output
        ref = d.loss_fn_inputs["ref_logprobs"].to_torch().tolist()
        assert ref[:-1] == [REF_LP] * (len(ref) - 1) and ref[-1] == 0.0
    logprobs = [torch.full((d.model_input.length,), -0.5 if i % 2 == 0 else -1.5) for i, d in enumerate(datums)]
    beta = 0.1
    margins = [0.5 * counts[0] + 0.5 * counts[1], 0.5 * counts[2] + 0.5 * counts[3]]
    expected_loss = sum(-math.log(1 / (1 + math.exp(-beta * m))) for m in margins)

    loss, metrics = DPO(beta=beta)(datums, logprobs)
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)
    named = dpo_metrics("train", metrics)
    assert named["train/accuracy"] == 1.0
    assert named["train/reward_margin"] == pytest.approx(beta * sum(margins) / 2, rel=1e-5)
    assert named["train/chosen_reward"] == pytest.approx(beta * 0.5 * (counts[0] + counts[2]) / 2, rel=1e-5)
    assert named["train/rejected_reward"] == pytest.approx(-beta * 0.5 * (counts[1] + counts[3]) / 2, rel=1e-5)

    # the loop's aggregation: seq_mean = the mean over pairs
    mean_loss, _ = Aggregated(DPO(beta=beta), "seq_mean")(datums, logprobs)
    assert float(mean_loss) == pytest.approx(expected_loss / 2, rel=1e-5)
    # IPO: sum over pairs of (margin - 1/(2 beta))^2
    ipo, _ = DPO(beta=beta, variant="ipo")(datums, logprobs)
    assert float(ipo) == pytest.approx(sum((m - 1 / (2 * beta)) ** 2 for m in margins), rel=1e-5)


def test_the_loop_step_on_a_trainer_reports_the_loss_of_the_trainers_logprobs(tokenizer, trainer):
    """run_loss (linearised) on the tiny trainer: its metrics are the DPO metrics of the logprobs
    the trainer computed, and the optimizer step moves the implicit rewards toward chosen."""
    pairs = pairset(tokenizer)
    reference = ReferenceCache(FakeReference())
    datums = pair_datums(pairs, [0, 1], reference, "train")
    out = run_loss(trainer, datums, Aggregated(DPO(beta=0.5), "seq_mean")).result()
    logprobs = [o["logprobs"].to_torch().float() for o in out.loss_fn_outputs]
    loss, metrics = DPO(beta=0.5)(datums, logprobs)
    assert out.metrics["loss:sum"] == pytest.approx(float(loss) / 2, rel=1e-5)
    assert dpo_metrics("train", out.metrics)["train/reward_margin"] == pytest.approx(metrics["dpo/reward_margin:mean"], rel=1e-5)
    before = metrics["dpo/reward_margin:mean"]
    trainer.optim_step({"learning_rate": 5e-2}).result()
    fwd = trainer.forward([cross_entropy_view(d) for d in datums], "cross_entropy").result()
    _, after = DPO(beta=0.5)(datums, [o["logprobs"].to_torch().float() for o in fwd.loss_fn_outputs])
    assert after["dpo/reward_margin:mean"] > before


def test_reference_logprobs_are_computed_once_per_sequence_and_reused(tokenizer):
    fake = FakeReference()
    reference = ReferenceCache(fake)
    pairs = pairset(tokenizer)
    for _ in range(3):  # three epochs over the same pairs, plus an evaluation split
        pair_datums(pairs, [1, 0], reference, "train")
    pair_datums(pairs, [0], reference, "eval")
    assert len(fake.calls) == 4 + 2 == reference.calls
    assert len(set(fake.calls)) == 4  # the eval pair is keyed separately (its own split)


@pytest.mark.parametrize(
    "record, message",
    [
        ({"prompt": "q", "chosen": "same", "rejected": "same"}, "pairs.jsonl:7: chosen and rejected are identical"),
        ({"prompt": "q", "chosen": "", "rejected": "no"}, "pairs.jsonl:7: 'chosen' is empty"),
        ({"prompt": "q", "chosen": "yes", "rejected": "   "}, "pairs.jsonl:7: 'rejected' is empty"),
        ({"prompt": "q", "chosen": "yes"}, "pairs.jsonl:7: no 'rejected'"),
        ({"prompt": "q", "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "a"}]}, "identical"),
        ({"prompt": "q", "chosen": 3, "rejected": "x"}, "'chosen' must be a string or a list of messages"),
    ],
)
def test_bad_pairs_are_refused_with_their_row(record, message):
    with pytest.raises(DataError) as err:
        load_pairs([record], ["pairs.jsonl:7"], PairFormatConfig())
    assert message in str(err.value) and "\n" not in str(err.value)


def test_pairs_identical_after_truncation_are_refused_with_their_row(tokenizer):
    long = "word " * 50
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=True, add_generation_prompt=True)
    limit = len(prompt["input_ids"] if hasattr(prompt, "keys") else prompt) + 5
    pairs = PairSet(load_pairs([{"prompt": "q", "chosen": long + "A", "rejected": long + "B"}], ["p.jsonl:3"], PairFormatConfig()), ["p.jsonl:3"], tokenizer, limit)
    with pytest.raises(DataError, match=rf"p.jsonl:3: chosen and rejected render to the same tokens \(max_length={limit}\)"):
        pairs.get(0)


def test_gsm8k_pairs_corrupt_only_the_stated_answer():
    record = {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "He has 3+4=<<3+4=7>>7 apples.\n#### 7"}
    pair = gsm8k_preference_pair(record)
    assert pair["prompt"] == record["question"]
    assert pair["chosen"] == "He has 3+4=7 apples.\n#### 7"  # calculator notes removed
    wrong = extract_answer(pair["rejected"])
    assert wrong != "7" and pair["rejected"] == f"He has 3+4=7 apples.\n#### {wrong}"
    assert gsm8k_preference_pair(record) == pair  # deterministic
    consistent = gsm8k_preference_pair_consistent(record)
    assert consistent["rejected"] == f"He has 3+4={wrong} apples.\n#### {wrong}"
    with pytest.raises(ValueError, match="####"):
        gsm8k_preference_pair({"question": "q", "answer": "no final line"})


def test_gsm8k_pairs_over_the_real_training_file_are_valid():
    from rlkit.data import load_records

    records = load_records("gsm8k/train.jsonl", limit=300)
    pairs = load_pairs([gsm8k_preference_pair(r) for r in records], [f"row {i}" for i in range(300)], PairFormatConfig())
    for p in pairs:
        assert extract_answer(p.rejected[0]["content"]) != extract_answer(p.chosen[0]["content"])
