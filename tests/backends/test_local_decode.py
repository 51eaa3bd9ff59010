"""The sampler's lean decode loop (``decode.FusedDecode``) against the model's own forward
(``decode.HFDecode``), and its shared-prompt attention against softmax attention by hand."""

import pytest
import torch

from rlkit.backends.local.decode import FusedDecode, FusedWeights, fused_unsupported_reason
from rlkit.backends.local.models import load_model, load_tokenizer
from rlkit.backends.local.sampler import SampleRequest, Sampler
from rlkit.types import SamplingParams

PROMPT = [1, 85, 91, 326, 71, 79, 201]


def mixed_requests():
    """Shared and distinct prompts of different lengths, greedy and sampled rows, rows finishing
    at different steps (so rows and whole prompts leave the batch), one budget past the suffix
    buffer's first capacity (64) so it grows."""
    return [
        SampleRequest(PROMPT, 3, SamplingParams(max_tokens=12, temperature=1.0, seed=3)),
        SampleRequest(PROMPT[:4], 2, SamplingParams(max_tokens=5, temperature=0.7, seed=4)),
        SampleRequest(PROMPT, 2, SamplingParams(max_tokens=9, temperature=0.0)),
        SampleRequest(list(range(5, 30)), 4, SamplingParams(max_tokens=90, temperature=1.0, seed=5)),
    ]


def one_row_per_prompt():
    """Distinct prompts (two left-padded), one sample each: the decode's one-row-per-prompt layout."""
    return [
        SampleRequest(PROMPT, 1, SamplingParams(max_tokens=70, temperature=1.0, seed=6)),
        SampleRequest(PROMPT[:3], 1, SamplingParams(max_tokens=20, temperature=0.0)),
        SampleRequest(list(range(5, 30)), 1, SamplingParams(max_tokens=40, temperature=0.8, seed=7)),
    ]


def compare(model, tokenizer, precision="fp32", adapter=None, tol=2e-5, requests=mixed_requests):
    fused = Sampler(model, tokenizer, [], precision=precision)  # no stop tokens: every row runs its budget
    plain = Sampler(model, tokenizer, [], precision=precision, fused=False)
    assert fused.fused is not None and plain.fused is None
    if adapter is not None:
        fused.set_weights("a", adapter)
        plain.set_weights("a", adapter)
    got, want = fused.sample(requests()), plain.sample(requests())
    for g, w in zip(got, want):
        for s, t in zip(g.sequences, w.sequences):
            assert s.tokens == t.tokens
            assert s.logprobs == pytest.approx(t.logprobs, abs=tol)
    return got


def test_fused_decode_equals_the_models_forward_on_llama():
    lm = load_model("tiny")
    out = compare(lm.model, lm.tokenizer)
    assert [len(s.tokens) for s in out[3].sequences] == [90] * 4  # grew past 64 positions


def test_one_row_per_prompt_and_batch_1_decode_like_the_models_forward():
    lm = load_model("tiny")
    compare(lm.model, lm.tokenizer, requests=one_row_per_prompt)
    compare(lm.model, lm.tokenizer, requests=lambda: one_row_per_prompt()[:1])


def test_fused_decode_equals_the_models_forward_on_qwen2_with_biases():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer("tiny")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():
        for p in model.parameters():  # non-zero biases, larger logits
            p.add_(torch.randn_like(p) * 0.05)
    compare(model, tokenizer)


def test_merged_adapters_reach_the_fused_weights():
    lm = load_model("tiny")
    gen = torch.Generator().manual_seed(1)
    adapter = {}
    for i, layer in enumerate(lm.model.model.layers):
        for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj"):
            w = layer.get_submodule(name).weight
            adapter[f"model.layers.{i}.{name}"] = (torch.randn(4, w.shape[1], generator=gen), torch.randn(w.shape[0], 4, generator=gen), 0.5)
    compare(lm.model, lm.tokenizer, adapter=adapter)
    sampler = Sampler(lm.model, lm.tokenizer, [])
    q_proj = sampler.model.model.layers[0].self_attn.q_proj
    assert q_proj.weight.data_ptr() == sampler.fused.layers[0].wqkv.data_ptr()  # a view, not a copy


def test_bf16_fused_decode_stays_close_to_the_models_forward():
    lm = load_model("tiny")
    fused = Sampler(lm.model, lm.tokenizer, [], precision="bf16")
    plain = Sampler(lm.model, lm.tokenizer, [], precision="bf16", fused=False)
    req = [SampleRequest(PROMPT, 2, SamplingParams(max_tokens=8, temperature=0.0))]
    a, b = fused.sample(req)[0].sequences[0], plain.sample(req)[0].sequences[0]
    n = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), len(a.tokens))
    assert n >= 1 and a.logprobs[:n] == pytest.approx(b.logprobs[:n], abs=0.05)  # bf16 rounding of the logits


def test_attention_with_lse_by_kernel_and_by_formula(monkeypatch):
    """Both ways ``attention_with_lse`` computes (the CPU kernel; the plain formula used elsewhere)
    against ``softmax(s) V`` and ``logsumexp(s)`` by hand, with a -inf bias on some keys."""
    from rlkit.backends.local import decode

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) for n in (5, 7, 7))
    bias = torch.zeros(2, 1, 1, 7)
    bias[0, ..., :2] = float("-inf")
    s = q @ k.transpose(-1, -2) * 0.3 + bias
    kernel = decode.attention_with_lse(q, k, v, bias, 0.3)
    monkeypatch.setattr(decode, "_CPU_FLASH", None)
    for out, lse in (kernel, decode.attention_with_lse(q, k, v, bias, 0.3)):
        assert torch.allclose(out, torch.softmax(s, dim=-1) @ v, atol=1e-5)
        assert torch.allclose(lse, torch.logsumexp(s, dim=-1, keepdim=True), atol=1e-5)


@pytest.mark.parametrize("kernel", [True, False], ids=["cpu-kernel", "formula"])
def test_shared_prompt_attention_is_softmax_attention(kernel, monkeypatch):
    """``_attend`` (each block's prompts once + each row's suffix, merged by log-sum-exp) against
    ``softmax(q K^T / sqrt(d)) V`` over each row's own keys: its prompt (left padding excluded)
    and its suffix columns from the step it joined. Two prompt blocks, uneven interleaved rows."""
    from rlkit.backends.local import decode
    from rlkit.backends.local.decode import _Block

    if not kernel:
        monkeypatch.setattr(decode, "_CPU_FLASH", None)

    gen = torch.Generator().manual_seed(0)
    kv, rep, d, n = 2, 3, 8, 4
    masks = [torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]]), torch.tensor([[0, 1, 1, 1]])]
    state = FusedDecode.__new__(FusedDecode)
    state.f = type("F", (), {"kv_heads": kv, "heads": kv * rep, "head_dim": d, "scale": d**-0.5})()
    state.device = torch.device("cpu")
    state.blocks = []
    for m in masks:
        keys, values = torch.randn(m.shape[0], kv, m.shape[1], d, generator=gen), torch.randn(m.shape[0], kv, m.shape[1], d, generator=gen)
        state.blocks.append(_Block([keys], [values], torch.zeros(m.shape).masked_fill_(m == 0, float("-inf"))))
    state.row_block, state.row_prompt = [0, 0, 1, 0, 1], [0, 1, 0, 0, 0]
    state.start = torch.tensor([0, 0, 2, 0, 1])  # rows 2 and 4 joined at steps 2 and 1
    ks, vs = torch.randn(5, kv, 10, d, generator=gen), torch.randn(5, kv, 10, d, generator=gen)
    state.suffix = [(ks, vs)]
    state._regroup()
    q = torch.randn(5, kv * rep, d, generator=gen)
    got = state._attend(0, q, n, state._suffix_bias(n)).view(5, kv, rep, d)
    for r in range(5):
        block, p = state.blocks[state.row_block[r]], state.row_prompt[r]
        valid = block.bias[p] == 0
        first = int(state.start[r])
        keys = torch.cat([block.keys[0][p][:, valid], ks[r, :, first:n]], dim=1)  # [kv, L', d]
        values = torch.cat([block.values[0][p][:, valid], vs[r, :, first:n]], dim=1)
        for h in range(kv):
            scores = q[r].view(kv, rep, d)[h] @ keys[h].T / d**0.5
            expected = torch.softmax(scores, dim=-1) @ values[h]
            assert torch.allclose(got[r, h], expected, atol=1e-6)


def two_prompts():
    """The tiny model's fused weights and two 3-token prompts (the first left-padded by one)."""
    lm = load_model("tiny")
    fused = FusedWeights(Sampler(lm.model, lm.tokenizer, []).model)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    return fused, torch.tensor([[0, 5, 6], [7, 8, 9]]), mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_rows_and_prompts_leave_the_shared_layout():
    fused, ids, mask, positions = two_prompts()
    with torch.inference_mode():
        state = FusedDecode(fused, ids, mask, positions, torch.tensor([0, 0, 1, 1, 1]))
        state.step(torch.tensor([1, 2, 3, 4, 5]))
        state.join(ids[:1], mask[:1], positions[:1], torch.tensor([0, 0]))  # a second block, two rows
        state.step(torch.tensor([1, 2, 3, 4, 5, 6, 7]))
        state.keep(torch.tensor([2, 4, 5]))  # block 0's prompt 0 has no rows left
        assert len(state.blocks) == 2 and state.blocks[0].keys[0].shape[0] == 1
        assert state.row_block == [0, 0, 1] and state.row_prompt == [0, 0, 0]
        assert state.blocks[0].group.tolist() == [[0, 1]] and state.blocks[1].rows.tolist() == [2]
        state.keep(torch.tensor([2]))  # only the joined row: the columns before its start go
    assert len(state.blocks) == 1 and state.n == 1 and state.start.tolist() == [0]


def test_the_one_row_per_prompt_layout_gives_what_the_shared_layout_gives():
    """Rows in prompt order take the direct path (``identity``); the same rows in another order
    take the shared-layout path. Same logits, row for row, over steps that grow the suffix."""
    fused, ids, mask, positions = two_prompts()
    with torch.inference_mode():
        direct = FusedDecode(fused, ids, mask, positions, torch.tensor([0, 1]))
        shared = FusedDecode(fused, ids, mask, positions, torch.tensor([1, 0]))
        assert direct.identity and not shared.identity
        a, b = direct.first_logits, shared.first_logits.flip(0)
        for t in range(5):
            assert torch.allclose(a, b, atol=1e-5)
            a, b = direct.step(torch.tensor([t + 1, t + 2])), shared.step(torch.tensor([t + 2, t + 1])).flip(0)
    assert torch.allclose(a, b, atol=1e-5)


def test_a_decode_whose_live_rows_all_joined_when_its_buffer_was_full_keeps_going():
    """Rows that finished, leaving only rows that joined once the suffix buffer was full: ``keep``
    cut every column, capacity 0, and the next step wrote past the end (IndexError in
    ``arithmetic_3digit_grpo``'s long continuous-batching rounds). It must go on as if alone."""
    fused, ids, mask, positions = two_prompts()
    with torch.inference_mode():
        state = FusedDecode(fused, ids, mask, positions, torch.tensor([0, 1]))
        for _ in range(state.suffix[0][0].shape[2]):  # fill the buffer: n == capacity
            state.step(torch.tensor([1, 2]))
        joined = state.join(ids[1:], mask[1:], positions[1:], torch.tensor([0]))
        state.keep(torch.tensor([2]))  # only the row that joined at the full buffer's end
        assert state.suffix[0][0].shape[2] == 0 and state.n == 0
        got = state.step(torch.tensor([3]))
        alone = FusedDecode(fused, ids[1:], mask[1:], positions[1:], torch.tensor([0]))
        want = alone.step(torch.tensor([3]))
    assert torch.allclose(joined, alone.first_logits, atol=1e-5) and torch.allclose(got, want, atol=1e-5)


def test_requests_joining_a_running_decode_get_what_they_get_alone():
    """Continuous batching: a request admitted between steps decodes as it would alone."""
    lm = load_model("tiny")
    sampler = Sampler(lm.model, lm.tokenizer, [])
    late = [SampleRequest(PROMPT[:5], 2, SamplingParams(max_tokens=6, temperature=0.0)),
            SampleRequest(list(range(40, 52)), 1, SamplingParams(max_tokens=9, temperature=0.0))]
    alone = [sampler.sample([r])[0] for r in late]
    queue, heard = [[], [late[0]], [], [late[1]]], {}
    first = [SampleRequest(PROMPT, 3, SamplingParams(max_tokens=12, temperature=0.0))]
    out = sampler.sample(first, admit=lambda live: queue.pop(0) if queue else [], on_done=lambda req, resp: heard.setdefault(id(req), resp))
    assert not queue and len(heard) == 3  # both joined, every request reported
    assert out[0].sequences[0].tokens == sampler.sample(first)[0].sequences[0].tokens
    for request, expected in zip(late, alone):
        got = heard[id(request)]
        for s, t in zip(got.sequences, expected.sequences):
            assert s.tokens == t.tokens and s.logprobs == pytest.approx(t.logprobs, abs=1e-5)


def test_unsupported_models_use_their_own_forward():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer("tiny")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=16,
                         max_window_layers=0, pad_token_id=tokenizer.pad_token_id)
    model = Qwen2ForCausalLM(config).eval()
    assert fused_unsupported_reason(model) == "sliding-window attention"
    sampler = Sampler(model, tokenizer, [])
    assert sampler.fused is None and "sliding-window" in sampler.decode_path
    out = sampler.sample([SampleRequest(PROMPT, 2, SamplingParams(max_tokens=3, temperature=1.0, seed=0))])
    assert [len(s.tokens) for s in out[0].sequences] == [3, 3]


def test_prefill_parts_by_hand():
    from rlkit.backends.local.batching import prefill_parts

    # prompts a (len 10, requests 0 and 3), b (len 4), c (len 7), d (len 2); budget 16 padded tokens
    keys, lengths = ["a", "b", "c", "a", "d"], [10, 4, 7, 10, 2]
    assert prefill_parts(keys, lengths, 40) == [[0, 1, 2, 3, 4]]  # 4 prompts x 10 <= 40: one pass
    # by length d(2), b(4), c(7), a(10): d+b pad to 4 (8), +c would pad to 7 (21 > 16); c alone; a alone
    assert prefill_parts(keys, lengths, 16) == [[1, 4], [2], [0, 3]]
    assert prefill_parts(["x"], [50], 16) == [[0]]  # a prompt over the budget is a part of its own


def test_a_prefill_in_parts_decodes_what_one_pass_decodes(monkeypatch):
    """Many prompts of different lengths prefill in length-sorted parts (each its own prompt block);
    every request gets, in request order, what the model's own forward gives it."""
    monkeypatch.setattr(Sampler, "PREFILL_TOKENS", 30)
    lm = load_model("tiny")
    parts = Sampler(lm.model, lm.tokenizer, [])._prefill_parts(mixed_requests())
    assert len(parts) == 2  # prompts of 4, 7 and 25 tokens: [4, 7] then [25]
    merged = []
    merge = FusedDecode.merge_blocks

    def counting_merge(self):
        before = len(self.blocks)
        merge(self)
        merged.append((before, len(self.blocks), self.blocks[0].bias.shape))

    monkeypatch.setattr(FusedDecode, "merge_blocks", counting_merge)
    out = compare(lm.model, lm.tokenizer)
    assert merged == [(2, 1, (3, 25))]  # the parts' caches, one block of 3 prompts padded to 25 tokens
    assert [len(s.tokens) for s in out[3].sequences] == [90] * 4
