"""Native vs linearised execution on the local backend give the same gradient."""

import pytest
import torch

from helpers import sft_datum
from rlkit.losses import CISPO, DPO, GSPO, PPO, CrossEntropy, ImportanceSampling, KLPenalty, ReverseKLDistillation, run_loss
from rlkit.types import AdamParams, Datum

SEQS = [[1, 40, 41, 42, 43, 2], [1, 50, 51, 52, 2], [1, 60, 61, 62, 63, 64, 65, 2]]


def rl_data(trainer, advs=(1.0, -0.7, 0.4)):
    """Datums with sampler logprobs slightly off the trainer's, so ratios are not all 1."""
    base = [sft_datum(t, prompt_len=2) for t in SEQS]
    lps = [o["logprobs"].to_torch() for o in trainer.forward(base).result().loss_fn_outputs]
    gen = torch.Generator().manual_seed(0)
    out = []
    for d, lp, adv in zip(base, lps, advs):
        n = d.model_input.length
        noisy = (lp + 0.3 * torch.randn(n, generator=gen)).tolist()
        out.append(Datum(model_input=d.model_input, loss_fn_inputs={
            **d.loss_fn_inputs, "logprobs": noisy, "advantages": [adv] * n,
            "ref_logprobs": (lp - 0.1).tolist(), "teacher_logprobs": (lp + 0.2 * torch.randn(n, generator=gen)).tolist()}))
    return out


def grads_of(trainer):
    return torch.cat([p.grad.reshape(-1).clone() for _, p in trainer._engine.named_trainable])


def clear(trainer):
    trainer._engine.optimizer.zero_grad(set_to_none=True)


def strip(data, keys):
    return [Datum(model_input=d.model_input, loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k in keys}) for d in data]


RL_KEYS = ("target_tokens", "weights", "logprobs", "advantages")


@pytest.mark.parametrize("loss, keys", [
    (CrossEntropy(), ("target_tokens", "weights")),
    (ImportanceSampling(), RL_KEYS),
    (PPO(), RL_KEYS),
    (CISPO(clip_low_threshold=0.9, clip_high_threshold=1.1), RL_KEYS),
    (ReverseKLDistillation(kl_coef=0.5), ("target_tokens", "weights", "logprobs", "teacher_logprobs", "advantages")),
])
@pytest.mark.parametrize("aggregation", ["sum", "token_mean"])
def test_native_and_linearised_gradients_match(warm_trainer, loss, keys, aggregation):
    data = strip(rl_data(warm_trainer), keys)
    clear(warm_trainer)
    native = run_loss(warm_trainer, data, loss, aggregation=aggregation).result()
    g_native = grads_of(warm_trainer)
    clear(warm_trainer)
    linear = run_loss(warm_trainer, data, loss, aggregation=aggregation, force_linearised=True).result()
    g_linear = grads_of(warm_trainer)
    assert "linearised" not in native.metrics and linear.metrics["linearised"] == 1.0
    rel = (g_native - g_linear).norm() / g_native.norm()
    assert rel <= 1e-5, float(rel)
    assert native.metrics["loss:sum"] == pytest.approx(linear.metrics["loss:sum"], rel=1e-4, abs=1e-6)


def test_non_builtin_losses_run_linearised_and_match_direct_autograd(warm_trainer):
    data = rl_data(warm_trainer)
    for loss, keys in ((GSPO(0.5, 1.5), RL_KEYS), (PPO(dual_clip=2.0) + 0.05 * KLPenalty(), RL_KEYS + ("ref_logprobs",))):
        batch = strip(data, keys)
        clear(warm_trainer)
        out = run_loss(warm_trainer, batch, loss, force_linearised=True).result()
        g_linear = grads_of(warm_trainer)
        assert out.metrics["linearised"] == 1.0
        clear(warm_trainer)
        warm_trainer.forward_backward(batch, loss).result()  # the local engine runs a Loss object directly
        g_direct = grads_of(warm_trainer)
        assert ((g_direct - g_linear).norm() / g_direct.norm()) <= 1e-5
        clear(warm_trainer)
        one_pass = run_loss(warm_trainer, batch, loss).result()  # run_loss routes it there: one pass
        assert "linearised" not in one_pass.metrics
        assert ((grads_of(warm_trainer) - g_linear).norm() / g_direct.norm()) <= 1e-5
        assert one_pass.metrics["loss:sum"] == pytest.approx(out.metrics["loss:sum"], rel=1e-4, abs=1e-6)


def test_dpo_trains_through_the_linearised_path(warm_trainer):
    chosen = sft_datum([1, 40, 41, 42, 43, 2], prompt_len=2)
    rejected = sft_datum([1, 40, 41, 77, 78, 2], prompt_len=2)
    ref = [o["logprobs"].tolist() for o in warm_trainer.forward([chosen, rejected]).result().loss_fn_outputs]
    pair = [Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "ref_logprobs": r}) for d, r in zip((chosen, rejected), ref)]
    clear(warm_trainer)
    first = run_loss(warm_trainer, pair, DPO(beta=0.5)).result()
    assert first.metrics["loss:sum"] == pytest.approx(-torch.nn.functional.logsigmoid(torch.tensor(0.0)).item(), rel=1e-4)
    warm_trainer.optim_step(AdamParams(learning_rate=2e-2)).result()
    for _ in range(5):
        run_loss(warm_trainer, pair, DPO(beta=0.5))
        warm_trainer.optim_step(AdamParams(learning_rate=2e-2))
    last = run_loss(warm_trainer, pair, DPO(beta=0.5)).result()
    assert last.metrics["dpo/reward_margin:mean"] > 0 and last.metrics["loss:sum"] < first.metrics["loss:sum"]
    clear(warm_trainer)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean", "constant"])
def test_a_research_loss_in_one_pass_has_the_linearised_gradient_under_every_aggregation(warm_trainer, aggregation):
    """The one-pass route compiles the aggregation (linear losses) or divides by the whole batch's
    normaliser (others) exactly as the linearised route does."""
    data = rl_data(warm_trainer)
    constant = 7.0 if aggregation == "constant" else None
    for loss, keys in ((GSPO(0.5, 1.5), RL_KEYS), (PPO(dual_clip=2.0), RL_KEYS)):
        if aggregation not in loss.allowed_aggregations:
            continue
        batch = strip(data, keys)
        clear(warm_trainer)
        linear = run_loss(warm_trainer, batch, loss, aggregation=aggregation, constant=constant, force_linearised=True).result()
        assert linear.metrics["linearised"] == 1.0
        g_linear = grads_of(warm_trainer)
        clear(warm_trainer)
        one_pass = run_loss(warm_trainer, batch, loss, aggregation=aggregation, constant=constant).result()
        g_one = grads_of(warm_trainer)
        clear(warm_trainer)
        assert "linearised" not in one_pass.metrics and g_linear.norm() > 0
        assert ((g_one - g_linear).norm() / g_linear.norm()) <= 1e-5, (loss.name, aggregation)
