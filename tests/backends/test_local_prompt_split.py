"""A group over the micro-batch budget runs in parts with its prompt once (rlkit.backends.local.prompt_split):
the same logprobs, metrics and gradients as one unsplit pass, and the prompt's tokens go through the model once."""

import pytest
import torch

from helpers import rl_datum
from rlkit.backends.local.batching import plan_micro_batches
from rlkit.types import AdamParams, Datum, ModelInput

PROMPT = [1] + list(range(100, 140))  # 41 tokens
COMPLETIONS = [[200, 201, 2], [210, 2], [220, 221, 222, 223, 2], [200, 201, 2], [230, 231, 2], [240, 2], [250, 251, 252, 2]]


def group(temperature=None):
    data = [rl_datum(PROMPT + c, [-2.0] * (len(PROMPT) + len(c)), adv, prompt_len=len(PROMPT))
            for c, adv in zip(COMPLETIONS, [1.0, -1.0, 0.5, -0.5, 0.3, -0.2, 0.8])]
    if temperature is not None:
        for d in data:
            d.loss_fn_inputs["temperature"] = [temperature] * d.model_input.length
    return data + [rl_datum([1, 40, 41, 42, 2], [-2.0] * 5, 0.3, prompt_len=2)]  # an unrelated datum rides along


def test_an_over_budget_group_is_one_micro_batch_run_in_parts():
    batches = plan_micro_batches(group(), 41 + 2 * 5)
    split = [b for b in batches if b[0].rows_per_part]
    assert len(split) == 1 and len(split[0]) == 1 and split[0][0].rows_per_part == 2 and len(split[0][0].indices) == 7
    assert all(u.rows_per_part == 0 for b in batches for u in b if b is not split[0])
    assert split[0][0].cost() == 41 + 2 * 5  # the prompt and its largest part
    assert not any(u.rows_per_part for b in plan_micro_batches(group(), 2048) for u in b)


def _tokens_through_the_model(client):
    seen = []
    handle = client._engine.decoder.embed_tokens.register_forward_hook(lambda m, args, out: seen.append(args[0].numel()))
    return seen, handle


@pytest.mark.parametrize("checkpointing,temperature", [(False, None), (True, 0.7)])
def test_parts_equal_one_pass_and_run_the_prompt_once(service, checkpointing, temperature):
    whole = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=5)
    parts = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=5)
    data = group(temperature)
    try:
        parts._engine.micro_batch_tokens = 41 + 2 * 5  # 2 rows a part: 4 parts
        for c in (whole, parts):
            c._engine.activation_checkpointing = checkpointing
            c.forward_backward(data, "ppo")
            c.optim_step(AdamParams(learning_rate=1e-2)).result()  # B != 0, so every LoRA factor gets a gradient
        seen, handle = _tokens_through_the_model(parts)
        b = parts.forward_backward(data, "ppo").result()
        handle.remove()
        a = whole.forward_backward(data, "ppo").result()
        assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-5)
        assert b.metrics["ppo/clip_frac:mean"] == pytest.approx(a.metrics["ppo/clip_frac:mean"], abs=1e-7)
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs):
            assert torch.allclose(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5)
        for (n1, p1), (_, p2) in zip(whole._engine.named_trainable, parts._engine.named_trainable):
            assert torch.allclose(p1.grad, p2.grad, atol=1e-5, rtol=1e-4), n1
        # the prompt once, then 4 parts of 2 rows x their longest completion, then the unrelated datum
        # (with checkpointing each layer replays inside the backward, not the embedding)
        unit = next(b[0] for b in plan_micro_batches(data, 41 + 2 * 5) if b[0].rows_per_part)
        suffix = [len(COMPLETIONS[i]) for i in unit.indices]
        parts_cost = [len(suffix[k : k + 2]) * max(suffix[k : k + 2]) for k in range(0, 7, 2)]
        assert sorted(seen) == sorted([41, *parts_cost, 5]), seen
    finally:
        whole.stop(), parts.stop()


def test_forward_in_parts_equals_one_pass(service):
    whole = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    parts = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    scoring = [Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"],
                                                                 "weights": [0.0] * d.model_input.length}) for d in group()]
    scoring.append(Datum(model_input=ModelInput.from_ints(PROMPT + [7]), loss_fn_inputs={"target_tokens": PROMPT[1:] + [7, 0],
                                                                                          "weights": [1.0] * 42}))
    try:
        parts._engine.micro_batch_tokens = 41 + 3 * 5
        a, b = whole.forward(scoring).result(), parts.forward(scoring).result()
        assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-6)
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs):
            assert torch.allclose(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5)
        assert all(p.grad is None for _, p in parts._engine.named_trainable)
    finally:
        whole.stop(), parts.stop()
