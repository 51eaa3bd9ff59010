"""Unmerged, per-row LoRA (rlkit.backends.local.multi_lora): several runs' rows in one pass give
each run the numbers it gets alone through the engine's own (PEFT) path — logprobs, gradients and
optimizer steps — with a different rank and alpha per run; rows with no adapter are the base model.

fp32 tolerances: logprobs 1e-5 absolute; gradients 1e-4 relative (+1e-7 absolute); weights after
one AdamW step (lr 1e-2) within 1 % of
the learning rate per entry and 1e-7 on average: Adam's first step is lr * g / (|g| + eps) per entry,
so an entry whose gradient is near 0 (3.1e-7 alone, 3.0e-7 fused: fp32 cancellation in a sum over
tokens) moves by a visible fraction of lr either way. The differences are matmul rounding over
other batch shapes."""

import pytest
import torch

from helpers import THREE_RUNS, THREE_RUNS_LOSSES, sft_datum, three_runs_data
from rlkit.backends.local.engine import LoraSpec, TrainingEngine
from rlkit.backends.local.models import load_model, share_base
from rlkit.backends.local.multi_lora import MultiLoraModel, RunWork, fused_run
from rlkit.errors import InvalidInputError
from rlkit.losses.registry import build_loss
from rlkit.types import AdamParams

RUNS = THREE_RUNS
PROMPT = [1] + list(range(100, 117))  # 18 tokens: run b's group shares it (the engine's shared-prompt path)


def data_of(key):
    return three_runs_data(key, PROMPT)


LOSSES = THREE_RUNS_LOSSES


@pytest.fixture(scope="module")
def base():
    return load_model("tiny").model


def engines(base):
    """One engine per run (own rank/alpha/seed), B made non-zero so every gradient is too."""
    out = {}
    for key, (rank, alpha, seed) in RUNS.items():
        engine = TrainingEngine(share_base(base), LoraSpec(rank=rank, alpha=alpha, seed=seed), activation_checkpointing=False)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _a, b, _s in engine.lora_modules().values():
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)
        out[key] = engine
    return out


def grads(engine):
    return {n: p.grad.clone() for n, p in engine.named_trainable}


def fused_model(base, engs, **options):
    model = MultiLoraModel(base, **options)
    for key, engine in engs.items():
        model.attach(key, engine)
    return model


def test_fused_forward_backward_and_step_equal_each_run_alone(base):
    """Each run alone through the engine (PEFT) vs all three in shared passes: logprobs, metrics,
    gradients, the engine's token count, then each run's own AdamW step."""
    solo, shared = engines(base), engines(base)
    params = AdamParams(learning_rate=1e-2)
    alone = {}
    for key, engine in solo.items():
        out = engine.run(data_of(key), build_loss(LOSSES[key]), backward=True)
        alone[key] = (out, grads(engine), engine.pending_grad_tokens, {n: p.detach().clone() for n, p in engine.named_trainable})
        engine.optim_step(params)
    model = fused_model(base, shared, activation_checkpointing=True)  # backward recomputes each layer: routing must hold
    assert model.checkpoint_layers(64) == 2
    works = [RunWork(key, data_of(key), build_loss(LOSSES[key])) for key in shared]
    # a budget that splits the batch: run b's rows straddle two micro-batches
    results = fused_run(model, works, backward=True, micro_batch_tokens=64)
    for (key, engine), fused in zip(shared.items(), results):
        out, alone_grads, alone_tokens, before = alone[key]
        for x, y in zip(fused.loss_fn_outputs, out.loss_fn_outputs):
            torch.testing.assert_close(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5, rtol=0)
        mine = grads(engine)
        assert mine.keys() == alone_grads.keys() and len(mine) == 2 * 14  # A and B of 7 projections x 2 layers
        for name, g in alone_grads.items():
            assert g.abs().max() > 0, name
            torch.testing.assert_close(mine[name], g, rtol=1e-4, atol=1e-7)
        assert engine.pending_grad_tokens == alone_tokens
        for metric in ("loss:sum", "tokens:train"):
            assert fused.metrics[metric] == pytest.approx(out.metrics[metric], rel=1e-5), (key, metric)
        engine.optim_step(params)  # the run's own optimizer, with the gradient the fused pass left it
        for (name, p), (_, q) in zip(engine.named_trainable, solo[key].named_trainable):
            assert (p - before[name]).abs().max() > 1e-3, name  # the step moved the weights
            torch.testing.assert_close(p, q, atol=1e-2 * params.learning_rate, rtol=0)
            assert (p - q).abs().mean() < 1e-7, name


def test_interleaved_rows_and_base_rows(base):
    """Rows of one adapter need not be contiguous (gathered and scattered back); a row with no
    adapter is the base model, in the same batch as adapted rows; a detached snapshot (what the
    sampler holds) routes like the live adapter."""
    engs = engines(base)
    model = fused_model(base, engs)
    model.add_adapter("c-snapshot", engs["c"].adapter_snapshot())
    data = [data_of("a")[0], data_of("c")[0], data_of("a")[1], data_of("b")[1], data_of("c")[0], data_of("a")[0], data_of("c")[0]]
    ids = ["a", None, "a", "b", "c", None, "c-snapshot"]
    with torch.no_grad():
        mixed = model.token_logprobs(data, ids)
        plain = base(torch.tensor([data[1].model_input.to_ints()])).logits.log_softmax(-1)[0]
    targets = torch.tensor(data[1].loss_fn_inputs["target_tokens"].data)
    torch.testing.assert_close(mixed[1], plain.gather(-1, targets[:, None])[:, 0], atol=1e-5, rtol=0)
    assert (mixed[5] - mixed[0]).abs().max() > 1e-3  # same tokens: base and adapter a differ
    torch.testing.assert_close(mixed[6], mixed[4], atol=1e-6, rtol=0)
    for i, key in enumerate(ids):
        if key is None or key == "c-snapshot":
            continue
        alone = engs[key].run([data[i]], build_loss("cross_entropy" if key != "b" else "ppo"), backward=False)
        torch.testing.assert_close(mixed[i], alone.loss_fn_outputs[0]["logprobs"].to_torch(), atol=1e-5, rtol=0)
    scored = fused_run(model, [RunWork(k, data_of(k), build_loss(LOSSES[k])) for k in "ab"], backward=False)  # `forward`
    for k, out in zip("ab", scored):
        alone = engs[k].run(data_of(k), build_loss(LOSSES[k]), backward=False)
        for x, y in zip(out.loss_fn_outputs, alone.loss_fn_outputs):
            torch.testing.assert_close(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5, rtol=0)
        assert out.metrics["loss:sum"] == pytest.approx(alone.metrics["loss:sum"], rel=1e-5)
        assert all(p.grad is None for _, p in engs[k].named_trainable) and engs[k].pending_grad_tokens == 0


def test_auto_checkpointing_of_a_fused_pass_is_the_engines_rule_on_its_tokens(base, monkeypatch):
    """``auto`` in a fused pass is the one process's budget (the memory there is), told the fused
    micro-batch's padded tokens: the layers one engine would checkpoint for as many tokens."""
    from rlkit.backends.local import activations

    engs = engines(base)
    model = fused_model(base, engs, activation_checkpointing="auto")
    engine = next(iter(engs.values()))
    engine.activation_checkpointing = "auto"
    for free in (0, 7_555_200, 10**12):
        monkeypatch.setattr(activations, "available_memory", lambda device, free=free: free)
        assert [model.checkpoint_layers(t) for t in (50, 100, 300)] == [engine.checkpoint_layers(t) for t in (50, 100, 300)]
    monkeypatch.setattr(activations, "available_memory", lambda device: 7_555_200)
    assert model.checkpoint_layers(100) == 1  # tests/backends/test_local_activation_memory.py: the rule by hand
    seen = []
    rule = model.checkpoint_layers
    monkeypatch.setattr(model, "checkpoint_layers", lambda tokens: seen.append(tokens) or rule(tokens))
    fused_run(model, [RunWork(k, data_of(k), build_loss(LOSSES[k])) for k in "ac"], backward=True)
    assert len(seen) == 1 and seen[0] >= max(len(d.model_input.to_ints()) for k in "ac" for d in data_of(k))


def test_a_failing_run_does_not_fail_the_others(base):
    engs = engines(base)
    model = fused_model(base, engs)
    bad = sft_datum([1, 40, 41, 2])
    bad.loss_fn_inputs["weights"] = [float("inf")] * 4
    results = fused_run(model, [RunWork("a", [bad], build_loss("cross_entropy")),
                                RunWork("c", data_of("c"), build_loss("cross_entropy"))], backward=True)
    assert isinstance(results[0], Exception) and "not finite" in str(results[0])
    # the failed run's gradient is unchanged (autograd may have passed it zeros); the other run's moved
    assert all(p.grad is None or not p.grad.any() for _, p in engs["a"].named_trainable) and engs["a"].pending_grad_tokens == 0
    assert all(p.grad.any() for _, p in engs["c"].named_trainable) and results[1].metrics["tokens:train"] == 11


def test_bad_routing_is_refused_in_one_line(base):
    model = fused_model(base, engines(base))
    with pytest.raises(InvalidInputError, match=r"adapter ids \['zz'\] are not added"):
        model.token_logprobs([sft_datum([1, 40, 2])], ["zz"])
    a, b, s = next(iter(model.adapters["a"].values()))
    with pytest.raises(InvalidInputError, match="do not fit"):
        model.add_adapter("wrong", {"model.layers.0.self_attn.q_proj": (a.t(), b, s)})
    model.remove_adapter("a")  # a run that stopped: its rows are refused like an unknown run's
    with pytest.raises(InvalidInputError, match=r"adapter ids \['a'\] are not added"):
        model.token_logprobs([sft_datum([1, 40, 2])], ["a"])
    assert "a" not in model.adapters and all("a" not in layer.adapters for layer in model.layers.values())


def test_runs_created_at_once_on_threads_get_their_seeds_adapters(base):
    """Sessions created concurrently on one process (a Tinker server's clients, jobs=shared) each
    get the LoRA initialisation of their own seed: PEFT draws from torch's global generator, which
    the engine seeds under one lock (device.seeded_global_rng)."""
    import threading

    def adapter(seed):
        engine = TrainingEngine(share_base(base), LoraSpec(rank=8, alpha=16, seed=seed), activation_checkpointing=False)
        return torch.cat([a.detach().flatten() for a, _b, _s in engine.lora_modules().values()])

    seeds = [21, 22, 23, 24]
    alone = {seed: adapter(seed) for seed in seeds}
    assert not torch.equal(alone[21], alone[22])
    together, start = {}, threading.Barrier(len(seeds))

    def create(seed):
        start.wait()
        together[seed] = adapter(seed)

    for _ in range(2):
        threads = [threading.Thread(target=create, args=(seed,)) for seed in seeds]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert all(torch.equal(together[seed], alone[seed]) for seed in seeds)
