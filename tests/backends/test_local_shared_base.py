"""One frozen copy of the base weights per process: every training session and the sampler are
module trees over the runtime's tensors (same storage, never written), each adding only its
adapter, optimizer state and caches."""

import torch

from helpers import sft_datum
from rlkit.backends.local.models import load_model, share_base, shares_storage
from rlkit.types import AdamParams

SEQ = [1, 40, 41, 42, 43, 44, 45, 46, 47, 2]


def base_tensors(model):
    return {n: p for n, p in model.named_parameters()}


def frozen_base(trainer):
    """The training model's base parameters, by their name in the plain model."""
    out = {}
    for n, p in trainer._engine.model.named_parameters():
        if "lora_" not in n:
            out[n.removeprefix("base_model.model.").replace(".base_layer", "")] = p
    return out


def logprobs(trainer):
    return trainer.forward([sft_datum(SEQ)]).result().loss_fn_outputs[0]["logprobs"].to_torch()


def test_training_sessions_and_the_sampler_share_one_base(service):
    a = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    b = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=1)
    try:
        base = base_tensors(a._runtime.loaded.model)
        pristine = {n: p.detach().clone() for n, p in base.items()}
        for trainer in (a, b):
            mine = frozen_base(trainer)
            assert mine.keys() == base.keys()
            for n, p in mine.items():
                assert p.data_ptr() == base[n].data_ptr() and not p.requires_grad, n
        sampler = a._runtime.sampler.sampler
        if sampler.dtype == torch.float32:  # fp32 sampler: embeddings, norms and the unfused projections shared too
            sampled = dict(sampler.model.named_parameters())
            assert shares_storage(sampled["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
            assert shares_storage(sampled["model.layers.0.self_attn.o_proj.weight"], base["model.layers.0.self_attn.o_proj.weight"])

        before_b = logprobs(b)
        base_sampler = service.create_sampling_client(base_model="tiny")
        greedy = {"max_tokens": 6, "temperature": 0.0}
        base_tokens = base_sampler.sample(SEQ[:5], sampling_params=greedy).result().sequences[0].tokens
        for _ in range(2):
            a.forward_backward([sft_datum(SEQ, prompt_len=3)]).result()
            a.optim_step(AdamParams(learning_rate=5e-2)).result()
        assert (logprobs(a) - before_b).abs().max() > 1e-3  # a learned
        torch.testing.assert_close(logprobs(b), before_b, atol=0, rtol=0)  # b did not move
        trained = a.save_weights_and_get_sampling_client("a1")
        trained_tokens = trained.sample(SEQ[:5], sampling_params=greedy).result().sequences[0].tokens  # merged into the sampler
        assert base_sampler.sample(SEQ[:5], sampling_params=greedy).result().sequences[0].tokens == base_tokens
        for n, p in base.items():
            assert torch.equal(p, pristine[n]), f"{n} was written"
        assert trained_tokens is not None
        if sampler.dtype == torch.float32:  # back on the base: the merge's own copies are dropped again
            sampled = dict(sampler.model.named_parameters())
            assert shares_storage(sampled["model.layers.0.self_attn.o_proj.weight"], base["model.layers.0.self_attn.o_proj.weight"])
    finally:
        a.stop(), b.stop()


def test_share_base_shares_ties_and_converts_once_in_another_precision():
    model = load_model("tiny").model
    same = share_base(model)
    assert same is not model and same.model.layers[0] is not model.model.layers[0]
    assert same.lm_head.weight is same.model.embed_tokens.weight is model.model.embed_tokens.weight  # tie kept, shared
    half = share_base(model, torch.bfloat16)
    assert half.lm_head.weight is half.model.embed_tokens.weight and half.lm_head.weight.dtype == torch.bfloat16
    assert not shares_storage(half.lm_head.weight, model.lm_head.weight)
    assert model.lm_head.weight.dtype == torch.float32  # the base itself untouched
    ids = torch.tensor([SEQ])
    with torch.no_grad():
        torch.testing.assert_close(same(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)
