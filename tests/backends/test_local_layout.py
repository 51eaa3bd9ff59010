"""The one-process engine's choice between a GRPO group's two layouts (rlkit.backends.local.layout):
the FLOP estimate by hand, the choice it makes, and the same numbers either way."""

import pytest
import torch

from helpers import rl_datum
from rlkit.backends.local import layout
from rlkit.backends.local.batching import Unit
from rlkit.types import AdamParams

PROMPT = [1] + list(range(100, 140))  # 41 tokens, shared by the group


def test_pass_cost_by_hand():
    """cost(rows, width, keys) = rows * width * (linear + keys * attention), dense attention."""
    cost = layout.PassCost(linear=10.0, attention=1.0)
    group = Unit([0, 1], 4, [6, 7])  # a 4-token prompt, suffixes of 2 and 3 tokens
    plain = Unit([2], 0, [5])
    plan = [[group, plain]]
    # packed: 2 rows, the longest 4 + 2 + 3 = 9 tokens: 2 * 9 * (10 + 9)
    assert cost.packed(plan) == 2 * 9 * (10 + 9)
    # two passes: the prompt (1 x 4, 4 keys), the 2 suffixes (width 3, 4 + 3 keys), the plain row (1 x 5)
    assert cost.two_pass(plan) == 1 * 4 * (10 + 4) + 2 * 3 * (10 + 7) + 1 * 5 * (10 + 5)


def test_pass_cost_of_the_tiny_model_counts_its_weight_matrices_and_heads(service):
    client = service.create_lora_training_client("tiny", rank=4, alpha=8)
    try:
        engine = client._engine
        c = engine.causal_lm.config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        h, q, kv = c.hidden_size, c.num_attention_heads * hd, c.num_key_value_heads * hd
        base = h * q + 2 * h * kv + q * h + 3 * h * c.intermediate_size  # q, k, v, o; gate, up, down
        lora = sum(a.numel() + b.numel() for a, b, _s in engine.lora_modules().values()) // c.num_hidden_layers
        assert engine.pass_cost.linear == 2.0 * c.num_hidden_layers * (base + lora)
        assert engine.pass_cost.attention == 4.0 * c.num_attention_heads * hd * c.num_hidden_layers
    finally:
        client.stop()


def group(suffix_len: int, members: int = 4):
    return [rl_datum(PROMPT + [200 + k] * suffix_len + [2], [-2.0] * (len(PROMPT) + suffix_len + 1), adv,
                     prompt_len=len(PROMPT)) for k, adv in zip(range(members), (1.0, -1.0, 0.5, -0.5))]


def test_short_completions_pack_long_ones_take_two_passes(service):
    """The rule (packed when its estimate <= PACKED_MARGIN x the two passes') picks each layout, and
    forward_backward runs what it picked."""
    client = service.create_lora_training_client("tiny", rank=4, alpha=8)
    try:
        engine = client._engine
        for suffix, want in ((3, True), (200, False)):
            data = group(suffix)
            two = layout.plan_micro_batches(data, engine.micro_batch_tokens, engine.min_shared_prefix)
            one = layout.packed.plan(data, engine.micro_batch_tokens, engine.min_shared_prefix)
            ratio = engine.pass_cost.packed(one) / engine.pass_cost.two_pass(two)
            assert (ratio <= layout.PACKED_MARGIN) is want, ratio
            assert engine.layout(data)[1] is want and engine.packed_pays(data) is want
            client.forward_backward(data, "ppo").result()
            assert engine.packed_last is want
        plain = [rl_datum([1, 40, 41, 42, 2], [-2.0] * 5, 0.3, prompt_len=2)]
        assert engine.layout(plain)[1] is False and engine.packed_pays(plain)  # nothing to pack: either layout
    finally:
        client.stop()


@pytest.mark.parametrize("suffix", [3, 200])
def test_either_layout_gives_the_same_logprobs_and_gradients(service, monkeypatch, suffix):
    """The engine's choice against the other layout forced, after a step (B != 0)."""
    data = group(suffix)
    chosen = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=3)
    other = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=3)
    try:
        for c in (chosen, other):
            c.forward_backward(data, "ppo")
            c.optim_step(AdamParams(learning_rate=1e-2)).result()
        a = chosen.forward_backward(data, "ppo").result()
        monkeypatch.setattr(layout, "PACKED_MARGIN", 0.0 if chosen._engine.packed_last else float("inf"))
        b = other.forward_backward(data, "ppo").result()
        assert chosen._engine.packed_last is not other._engine.packed_last
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs):
            torch.testing.assert_close(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5, rtol=0)
        for (name, p1), (_, p2) in zip(chosen._engine.named_trainable, other._engine.named_trainable):
            assert p1.grad.abs().max() > 0, name
            torch.testing.assert_close(p1.grad, p2.grad, atol=1e-6, rtol=1e-4)
    finally:
        chosen.stop(), other.stop()


def test_a_sliding_window_model_never_packs_a_row_longer_than_its_window(service):
    """A packed row's block mask replaces the model's sliding-window mask, so a row over the window
    would attend too far (tiny-gemma2: 8-token windows): such data takes two passes and is not
    offered to a fused pass; rows within the window still may."""
    from types import SimpleNamespace

    assert layout.sliding_window(SimpleNamespace(sliding_window=4096)) == 4096
    assert layout.sliding_window(SimpleNamespace(sliding_window=4096, use_sliding_window=False)) is None
    assert layout.sliding_window(SimpleNamespace()) is None
    client = service.create_lora_training_client("tiny-gemma2", rank=4, alpha=8)
    try:
        engine = client._engine
        assert engine.pass_cost.window == 8
        data = group(3)  # a short-completion group: packs on the tiny llama (above)
        assert engine.layout(data)[1] is False and not engine.packed_pays(data)
        short = [rl_datum([1, 40, 41, 42, 2], [-2.0] * 5, 0.3, prompt_len=2)]
        assert engine.packed_pays(short)
    finally:
        client.stop()
