"""Activation memory of the local engine: per-layer checkpointing (same gradients, fewer saved
bytes, the ``auto`` rule by hand) and out-of-memory as one line that leaves the session usable."""

import pytest
import torch

import rlkit
from helpers import rl_datum
from rlkit.backends.local import activations
from rlkit.backends.local.activations import check_mode, layers_to_checkpoint, saved_bytes_per_token_layer
from rlkit.errors import InvalidInputError, OperationError
from rlkit.types import AdamParams


def rl_batch():
    """Two shared prompts (one with a per-token temperature), and an unrelated datum (plain rows)."""
    prompt = [1] + list(range(100, 130))
    other = [1] + list(range(300, 320))
    completions = [[200, 201, 2], [210, 2], [220, 221, 222, 223, 2]]
    data = [rl_datum(prompt + c, [-2.0] * (len(prompt) + len(c)), a, prompt_len=len(prompt)) for c, a in zip(completions, [1.0, -1.0, 0.5])]
    for c, a in zip(completions, [0.2, -0.4, 0.9]):
        d = rl_datum(other + c, [-1.5] * (len(other) + len(c)), a, prompt_len=len(other))
        d.loss_fn_inputs["temperature"] = [0.7] * (len(other) + len(c))
        data.append(d)
    data += [rl_datum([1, 40, 41, 42, 2], [-2.0] * 5, 0.3, prompt_len=2), rl_datum([1, 50, 51, 2], [-2.0] * 4, -0.6, prompt_len=2)]
    return data


def grads(client):
    return [p.grad.clone() for _, p in client._engine.named_trainable]


def test_checkpointing_gives_the_same_logprobs_and_gradients(service):
    on = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=5)
    off = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=5)
    try:
        on._engine.activation_checkpointing, off._engine.activation_checkpointing = True, False
        data = rl_batch()
        for c in (on, off):
            c.forward_backward(data, "ppo").result()
            c.optim_step(AdamParams(learning_rate=1e-2)).result()  # B != 0: gradients reach A too
        a = on.forward_backward(data, "ppo").result()
        b = off.forward_backward(data, "ppo").result()
        assert on._engine.checkpointed_layers == [2, 2] and off._engine.checkpointed_layers == [0, 0]  # shared + plain rows
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs):
            assert torch.equal(x["logprobs"].to_torch(), y["logprobs"].to_torch())
        for (name, _), g1, g2 in zip(on._engine.named_trainable, grads(on), grads(off)):
            assert g1.abs().sum() > 0, name
            assert torch.allclose(g1, g2, atol=1e-6, rtol=0), name
        assert a.metrics["loss:sum"] == pytest.approx(b.metrics["loss:sum"], abs=1e-6)
    finally:
        on.stop(), off.stop()


def saved_bytes(engine, data, layers):
    """Bytes the autograd graph of one micro-batch saves for backward (distinct storages)."""
    from rlkit.backends.local.batching import make_units

    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        engine.token_logprobs(data, make_units(data, engine.min_shared_prefix), checkpoint_layers=layers)
    return sum(seen.values())


def test_checkpointed_layers_save_less(trainer):
    engine, data = trainer._engine, rl_batch()
    full, half, none = (saved_bytes(engine, data, k) for k in (0, 1, 2))
    assert none < half < full and none < 0.6 * full, (full, half, none)
    with torch.no_grad():  # scoring passes never checkpoint (nothing to replay)
        engine.token_logprobs(data, checkpoint_layers=2)


def test_auto_rule_by_hand(trainer, monkeypatch):
    # 1000 tokens x 10 layers x 100 B = 1,000,000 B; budget 600,000 B; a checkpointed layer frees
    # 1000 x (100 - 20) = 80,000 B: (1,000,000 - 600,000) / 80,000 = 5 layers
    assert layers_to_checkpoint(1000, 10, 100, 20, 600_000) == 5
    assert layers_to_checkpoint(1000, 10, 100, 20, 600_001) == 5 and layers_to_checkpoint(1000, 10, 100, 20, 599_999) == 6
    assert layers_to_checkpoint(1000, 10, 100, 20, 1_000_000) == 0
    assert layers_to_checkpoint(1000, 10, 100, 20, 0) == 10
    assert layers_to_checkpoint(1000, 10, 100, 20, -5) == 10
    smollm2 = type("C", (), {"hidden_size": 576, "intermediate_size": 1536, "vocab_size": 49152, "num_attention_heads": 9})()
    assert saved_bytes_per_token_layer(smollm2) == (10 * 576 + 4 * 1536) * 4 == 47_616  # x 30 layers: 1.43 MB a token
    # working memory: 3 [min(T, 256), V] float32 tensors + one layer's attention scores and weights (2 x heads x T^2
    # float32) + 2 layers' activations: 2048 tokens of SmolLM2
    assert activations.working_bytes(2048, smollm2) == 3 * 256 * 49152 * 4 + 2 * 9 * 2048**2 * 4 + 2 * 2048 * 47_616
    # the tiny model: hidden 128, intermediate 256, vocab 512, 4 heads, 2 layers: b = (1280 + 1024) x 4 = 9,216 B, kept
    # 512 B. 100 tokens save 1,843,200 B; working memory W = 3 x 100 x 512 x 4 + 2 x 4 x 100^2 x 4 + 2 x 100 x 9,216
    # = 614,400 + 320,000 + 1,843,200 = 2,777,600 B; a checkpointed layer frees 100 x (9,216 - 512) = 870,400 B
    engine = trainer._engine
    engine.activation_checkpointing = "auto"
    assert activations.working_bytes(100, engine.causal_lm.config) == 2_777_600
    # auto: half the free memory, less W. Free 7,555,200 B -> budget 1,000,000 B -> ceil(843,200 / 870,400) = 1 layer
    for free, layers in ((7_555_200, 1), (10**12, 0), (0, 2), (2 * 2_777_600 + 2 * 1_843_200, 0)):
        monkeypatch.setattr(activations, "available_memory", lambda device, free=free: free)
        assert engine.checkpoint_layers(100) == layers, free
    # a limit (Within): budget = (limit - floor) / LIMIT_MARGIN - W, the floor read once (resident memory when the
    # model first trains, plus 12 B a trainable parameter: its gradient and two Adam moments in float32)
    monkeypatch.setattr(activations, "available_memory", lambda device: 10**12)
    trainable = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
    monkeypatch.setattr(activations, "resident_bytes", lambda device: 10_000_000 - 12 * trainable)
    activations._FLOORS.pop(engine.model, None)
    m = activations.LIMIT_MARGIN

    def limit_for(budget):
        return int(10_000_000 + m * (2_777_600 + budget))

    # budget 1,000,000 -> 1 layer; 1,843,200 -> none; 0 -> both (1 layer needs a budget >= 1,843,200 - 870,400)
    for limit, layers in ((limit_for(1_000_000), 1), (limit_for(1_843_200) + 2, 0), (limit_for(0), 2), (limit_for(972_700), 2), (1, 2)):
        engine.activation_checkpointing = activations.Within(limit)
        assert engine.checkpoint_layers(100) == layers, limit
    monkeypatch.setattr(activations, "resident_bytes", lambda device: 10**15)  # later readings keep freed memory: not read again
    engine.activation_checkpointing = activations.Within(limit_for(1_000_000))
    assert engine.checkpoint_layers(100) == 1
    monkeypatch.setattr(activations, "available_memory", lambda device: 7_555_200)  # the free memory still bounds it
    engine.activation_checkpointing = activations.Within(10**12)
    assert engine.checkpoint_layers(100) == 1
    engine.activation_checkpointing = False
    assert engine.checkpoint_layers(100) == 0


@pytest.mark.parametrize("limit, said", [
    (0, "memory_limit_gb=0: expected a size in GB > 0"), (-2, "memory_limit_gb=-2: expected a size in GB > 0"),
    ("lots", "memory_limit_gb='lots': expected a size in GB > 0"),
])
def test_a_bad_memory_limit_is_one_line_at_connect(tmp_path, limit, said):
    with pytest.raises(InvalidInputError) as err:
        rlkit.connect("local", memory_limit_gb=limit, checkpoint_dir=tmp_path)
    assert str(err.value).startswith(said)
    with pytest.raises(InvalidInputError, match="memory_limit_gb=3: it guides activation_checkpointing=auto, and this session's is True"):
        rlkit.connect("local", memory_limit_gb=3, activation_checkpointing=True, checkpoint_dir=tmp_path)


def test_connect_passes_the_limit_to_the_engine(tmp_path):
    svc = rlkit.connect("local", precision="fp32", memory_limit_gb=1.5, checkpoint_dir=tmp_path)
    try:
        engine = svc.create_lora_training_client("tiny", rank=4, alpha=8)._engine
        assert engine.activation_checkpointing == activations.Within(int(1.5 * 2**30))
    finally:
        svc.close()


@pytest.mark.parametrize("value, mode", [("auto", "auto"), (True, True), ("True", True), ("false", False), (False, False)])
def test_modes(value, mode):
    assert check_mode(value) == mode


def test_a_bad_mode_is_one_line_at_connect(tmp_path):
    with pytest.raises(InvalidInputError, match="activation_checkpointing='sometimes': expected false, true or auto"):
        rlkit.connect("local", activation_checkpointing="sometimes", checkpoint_dir=tmp_path)


def test_connect_passes_the_mode_to_the_engine(tmp_path):
    svc = rlkit.connect("local", precision="fp32", activation_checkpointing="true", checkpoint_dir=tmp_path)
    try:
        assert svc.create_lora_training_client("tiny", rank=4, alpha=8)._engine.activation_checkpointing is True
    finally:
        svc.close()


FAULTS = [
    lambda: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory: you tried to allocate 3221225472 bytes."),
    lambda: MemoryError(),
]


def test_out_of_memory_is_recognised():
    from rlkit.backends.local.oom import is_out_of_memory

    assert all(is_out_of_memory(f()) for f in FAULTS)
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(ValueError("out of memory"))


@pytest.mark.parametrize("fault", [FAULTS[0], FAULTS[1]], ids=["cuda", "host"])
def test_out_of_memory_is_one_line_and_the_session_stays_usable(service, monkeypatch, fault):
    a = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    b = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    try:
        data = rl_batch()
        for c in (a, b):
            c._engine.micro_batch_tokens = 64  # several micro-batches: the fault hits after one backward
            c.forward_backward(data, "ppo").result()
        before = grads(a)
        engine, calls = a._engine, []
        real = engine.token_logprobs

        def flaky(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise fault()
            return real(*args, **kwargs)

        monkeypatch.setattr(engine, "token_logprobs", flaky)
        with pytest.raises(OperationError) as info:
            a.forward_backward(data, "ppo").result()
        message = str(info.value)
        assert "\n" not in message and "out of memory" in message and "micro-batch 2 of " in message
        assert "padded tokens" in message and "backend.micro_batch_tokens (now 64)" in message
        assert "backend.activation_checkpointing=true" in message
        assert all(torch.equal(x, y) for x, y in zip(grads(a), before))  # this call's partial gradients discarded
        monkeypatch.setattr(engine, "token_logprobs", real)
        a.forward_backward(data, "ppo").result()  # still usable, and equal to a session that never failed
        b.forward_backward(data, "ppo").result()
        assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(grads(a), grads(b)))
    finally:
        a.stop(), b.stop()


def test_other_errors_are_not_reported_as_out_of_memory(trainer, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(trainer._engine, "token_logprobs", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        trainer.forward_backward(rl_batch(), "ppo").result()


def test_cuda_without_cuda_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InvalidInputError) as info:
        rlkit.connect("local", device="cuda", checkpoint_dir=tmp_path)
    assert "device='cuda'" in str(info.value) and "sees no CUDA device" in str(info.value) and "\n" not in str(info.value)
