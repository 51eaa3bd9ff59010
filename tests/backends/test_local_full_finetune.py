"""Full-parameter fine-tuning on the local engine (issue 42 item 3): every weight trains, the
checkpoint round trip restores the same logprobs (and optimizer), the sampler-weights export is a
plain ``transformers`` model directory, the sampler samples from the trained weights, and engines
that cannot refuse in one line through their capabilities."""

from __future__ import annotations

import pytest
import torch

from rlkit.backends.local import checkpoints as ckpt
from rlkit.errors import CheckpointCorruptError, InvalidInputError
from rlkit.session import Capabilities, ServiceClientBase
from rlkit.types import AdamParams
from helpers import sft_datum

TOKENS = [1, 17, 42, 99, 7, 250, 3, 88, 64, 12]


def _data():
    return [sft_datum(TOKENS, prompt_len=3), sft_datum(TOKENS[::-1], prompt_len=2)]


def _logprobs(trainer):
    out = trainer.forward(_data(), "cross_entropy").result()
    return [o["logprobs"].to_torch() for o in out.loss_fn_outputs]


def _step(trainer, lr=1e-2):
    fb = trainer.forward_backward(_data(), "cross_entropy").result()
    opt = trainer.optim_step(AdamParams(learning_rate=lr)).result()
    return fb.metrics["loss:sum"], opt.metrics["grad_norm"]


@pytest.fixture()
def full(service):
    client = service.create_full_training_client("tiny", seed=0)
    yield client
    client.stop()


def test_every_parameter_trains_and_the_loss_goes_down(full, service):
    engine = full._engine
    base = dict(service._runtime("tiny").loaded.model.named_parameters())
    named = dict(engine.model.named_parameters())
    assert set(named) == set(base) and all(p.requires_grad for p in named.values())
    assert not any(ckpt_shares(p, base[n]) for n, p in named.items())  # its own copy: the shared base is never written
    before = {n: p.detach().clone() for n, p in named.items()}
    losses = [_step(full)[0] for _ in range(4)]
    assert losses[-1] < losses[0]
    changed = [n for n, p in named.items() if not torch.equal(p, before[n])]
    assert "model.embed_tokens.weight" in changed and "model.norm.weight" in changed and len(changed) == len(named)
    assert all(torch.equal(base[n], service._runtime("tiny").loaded.model.get_parameter(n)) for n in base)


def ckpt_shares(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_state_round_trip_gives_identical_logprobs_and_optimizer(full, service):
    _step(full)
    saved = full.save_state("full-rt").result().model_package_arn
    meta = ckpt.verify(saved)
    assert meta["rank"] == 0 and set(ckpt.expected_files(meta)) <= set(meta["files"])
    expected = _logprobs(full)
    next_loss = _step(full)  # the step a resumed session must repeat exactly
    full.load_state_with_optimizer(saved).result()
    assert all(torch.equal(a, b) for a, b in zip(_logprobs(full), expected))
    assert _step(full) == next_loss  # same weights, same Adam moments
    resumed = service.create_training_client_from_state_with_optimizer(saved)  # how `rlkit train` resumes
    try:
        assert resumed._engine.lora.full and resumed.steps == 1
        assert all(torch.equal(a, b) for a, b in zip(_logprobs(resumed), expected))
        assert _step(resumed) == next_loss
    finally:
        resumed.stop()


def test_a_corrupt_full_checkpoint_is_refused_and_changes_nothing(full, tmp_path):
    saved = full.save_state("full-corrupt").result().model_package_arn
    path = ckpt.resolve(saved) / ckpt.WEIGHTS
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    before = _logprobs(full)
    with pytest.raises(CheckpointCorruptError, match="model.safetensors"):
        full.load_state(saved).result()
    assert all(torch.equal(a, b) for a, b in zip(_logprobs(full), before))


def test_export_loads_in_plain_transformers_and_the_sampler_uses_the_trained_weights(full, service):
    from transformers import AutoModelForCausalLM

    from rlkit.types import ModelInput, SamplingParams

    base_sampler = service.create_sampling_client(base_model="tiny")
    base_lp = base_sampler.compute_logprobs(ModelInput.from_ints(TOKENS)).result()
    for _ in range(3):
        _step(full, lr=3e-2)
    exported = full.save_weights_for_sampler("full-export").result().model_package_arn
    model = AutoModelForCausalLM.from_pretrained(ckpt.resolve(exported), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0, :-1].float()
    hf = torch.log_softmax(logits, -1).gather(-1, torch.tensor(TOKENS[1:]).unsqueeze(-1)).squeeze(-1)
    session = _logprobs(full)[0][:-1]  # datum 0 scores TOKENS[1:] (its last target is padding)
    torch.testing.assert_close(hf, session, atol=1e-4, rtol=0)
    for sampler in (full.save_weights_and_get_sampling_client(), service.create_sampling_client(model_package_arn=exported)):
        lp = sampler.compute_logprobs(ModelInput.from_ints(TOKENS)).result()[1:]
        torch.testing.assert_close(torch.tensor(lp), session, atol=1e-4, rtol=0)  # no stale model
        assert sampler.sample(ModelInput.from_ints(TOKENS[:3]), 1, SamplingParams(max_tokens=4, seed=0)).result().sequences
    # the base sampler, run after the trained weights were set and swapped out, still sees the base
    assert base_sampler.compute_logprobs(ModelInput.from_ints(TOKENS)).result() == base_lp


def test_engines_without_full_finetuning_refuse_in_one_line():
    class LoraOnly(ServiceClientBase):
        capabilities = Capabilities(engine="tinker", builtin_losses={})

    with pytest.raises(InvalidInputError, match=r"^create_full_training_client: the tinker engine trains LoRA adapters only"):
        LoraOnly().create_full_training_client("tiny")
