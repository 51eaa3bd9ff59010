"""Checkpoints on the local backend: round trips, optimizer resume, PEFT format, isolation."""

import json
from pathlib import Path

import pytest
import torch

from helpers import adapter_state, same_state, sft_datum
from rlkit.backends.local import checkpoints as ckpt
from rlkit.types import AdamParams, SamplingParams

DATA = [sft_datum([1, 40, 41, 42, 43, 2], prompt_len=2), sft_datum([1, 50, 51, 52, 2], prompt_len=2)]
ADAM = AdamParams(learning_rate=2e-2)


def train(client, steps):
    for _ in range(steps):
        client.forward_backward(DATA)
        client.optim_step(ADAM)
    client.forward(DATA).result()


def test_save_state_then_resume_with_optimizer_is_bit_exact(service):
    a = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    try:
        train(a, 2)
        state = a.save_state("two steps").result().model_package_arn
        assert state.startswith("local://")
        train(a, 2)
        expected = adapter_state(a)
    finally:
        a.stop()
    b = service.create_training_client_from_state_with_optimizer(state)
    try:
        assert b.step == 2
        train(b, 2)
        assert same_state(adapter_state(b), expected)
    finally:
        b.stop()
    # load_state (weights only) resets the optimizer: the continuation differs
    c = service.create_training_client_from_state(state)
    try:
        assert not c._engine.optimizer.state
        train(c, 2)
        assert not same_state(adapter_state(c), expected)
    finally:
        c.stop()


def test_load_state_round_trips_weights(service):
    a = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    try:
        train(a, 1)
        saved = adapter_state(a)
        ck = a.save_weights_for_sampler().result().path
        train(a, 1)
        assert not same_state(adapter_state(a), saved)
        a.load_state(ck).result()
        assert same_state(adapter_state(a), saved)
    finally:
        a.stop()


def test_checkpoint_is_peft_format(service):
    from peft import PeftModel

    from rlkit.backends.local.models import load_model

    a = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    try:
        train(a, 1)
        path = ckpt.resolve(a.save_weights_for_sampler().result().path)
        expected = a.forward(DATA).result().loss_fn_outputs[0]["logprobs"].to_torch()
    finally:
        a.stop()
    assert (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()
    assert json.loads((path / "adapter_config.json").read_text())["r"] == 4
    assert not (path / "optimizer.pt").exists()
    base = load_model("tiny").model
    peft_model = PeftModel.from_pretrained(base, str(path)).eval()
    ids = torch.tensor([DATA[0].model_input.to_ints()])
    with torch.no_grad():
        logits = peft_model(input_ids=ids).logits[0].float()
    targets = ids[0, 1:]
    lp = torch.log_softmax(logits, -1)[torch.arange(len(targets)), targets]
    assert torch.allclose(lp, expected[:-1], atol=1e-5)


def test_sampling_client_is_bound_to_its_checkpoint(service):
    a = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=4)
    try:
        train(a, 1)
        sc = a.save_weights_and_get_sampling_client()
        prompt = [1, 40, 41]
        params = SamplingParams(max_tokens=6, temperature=1.0, seed=9)
        before = sc.sample(prompt, sampling_params=params).result().sequences[0]
        lp_before = sc.compute_logprobs(prompt + before.tokens).result()
        train(a, 5)
        a.save_weights_for_sampler().result()  # newer weights exist now
        after = sc.sample(prompt, sampling_params=params).result().sequences[0]
        assert after.tokens == before.tokens and after.logprobs == before.logprobs
        assert sc.compute_logprobs(prompt + before.tokens).result() == lp_before
        fresh = a.save_weights_and_get_sampling_client()
        assert fresh.compute_logprobs(prompt + before.tokens).result() != lp_before
    finally:
        a.stop()


def test_writes_are_atomic_and_names_unique(service, tmp_path):
    a = service.create_lora_training_client("tiny", rank=4, alpha=8)
    try:
        ids = {a.save_state().result().path for _ in range(3)}
        assert len(ids) == 3
        root = Path(next(iter(ids))[len("local://"):]).parent
        assert not [p for p in root.iterdir() if ".tmp-" in p.name]
        named = a.save_state(name="best").result().path
        with pytest.raises(Exception, match="already exists"):
            a.save_state(name="best").result()
        assert a.save_state(name="best", overwrite=True).result().path == named
    finally:
        a.stop()


def test_save_weights_and_get_sampling_client_keeps_weights_in_memory(service):
    import gc

    a = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=4)
    try:
        train(a, 1)
        before = set(a.checkpoint_root.glob("*")) if a.checkpoint_root.exists() else set()
        sc = a.save_weights_and_get_sampling_client()
        key = sc.weights_key
        assert key.startswith("local-memory://")
        after = set(a.checkpoint_root.glob("*")) if a.checkpoint_root.exists() else set()
        assert after == before  # no files per step
        lp = sc.compute_logprobs([1, 40, 41, 42]).result()
        again = service.create_sampling_client(model_package_arn=key)
        assert again.compute_logprobs([1, 40, 41, 42]).result() == lp
        worker = service._runtimes["tiny"].sampler
        del sc
        gc.collect()
        assert worker.is_pinned(key) and again.compute_logprobs([1, 40, 41, 42]).result() == lp  # still held
        del again
        gc.collect()
        assert not worker.is_pinned(key)  # released with its last client
        with pytest.raises(Exception, match="gone"):
            a.create_sampling_client(key)
        named = a.save_weights_and_get_sampling_client(name="kept")
        assert named.weights_key.startswith("local://") and (a.checkpoint_root / "kept").is_dir()
    finally:
        a.stop()
