"""Research losses cannot silently train something else: a subclass that overrides ``compute``
trains with its own ``compute`` (never the inherited built-in), hooks have safe defaults, and a
loss that makes no promise is computed over the whole batch."""

import pytest
import torch

from helpers import sft_datum
from rlkit.losses import CISPO, PPO, CrossEntropy, ImportanceSampling, Loss, ReverseKLDistillation, build_loss, run_loss
from rlkit.losses.base import batch_input

from test_run_loss import RL_KEYS, clear, grads_of, rl_data, strip


def with_extra_term(base: type) -> type:
    """A research subclass of ``base`` that overrides only ``compute``: the built-in's objective
    plus ``0.3 * sum w * lp^2`` (a term whose gradient points elsewhere)."""

    class Research(base):
        name = f"research_{base.name}"

        def compute(self, data, logprobs):
            value, metrics = super().compute(data, logprobs)
            w = batch_input(data, "weights")
            extra = 0.3 * (w * torch.cat(list(logprobs)) ** 2).sum()
            return value + extra, {**metrics, "loss:sum": float((value + extra).detach())}

    return Research


class ExtraTermOnly(Loss):
    name = "extra_only"
    optional_inputs = ("temperature", "logprobs", "advantages", "teacher_logprobs")

    def compute(self, data, logprobs):
        w = batch_input(data, "weights")
        value = 0.3 * (w * torch.cat(list(logprobs)) ** 2).sum()
        return value, {"loss:sum": float(value.detach())}


BUILTINS = [
    (CrossEntropy, ("target_tokens", "weights")),
    (ImportanceSampling, RL_KEYS),
    (PPO, RL_KEYS),
    (CISPO, RL_KEYS),
    (ReverseKLDistillation, ("target_tokens", "weights", "logprobs", "teacher_logprobs")),
]


@pytest.mark.parametrize("base", [b for b, _ in BUILTINS])
def test_builtin_is_native_and_a_subclass_is_not(base):
    assert base().native_call() is not None
    assert with_extra_term(base)().native_call() is None  # builtin is never inherited

    class OnPurpose(base):  # a subclass that declares the built-in in its own body stays native
        builtin = base.builtin

    assert OnPurpose().native_call().name == base.builtin


@pytest.mark.parametrize("base, keys", BUILTINS)
def test_subclass_trains_with_its_own_compute(warm_trainer, base, keys):
    data = strip(rl_data(warm_trainer), keys)
    research = with_extra_term(base)()

    clear(warm_trainer)
    out = run_loss(warm_trainer, data, research).result()
    g_research = grads_of(warm_trainer)
    assert "linearised" not in out.metrics  # the local engine runs a Loss object in one pass

    clear(warm_trainer)
    linear = run_loss(warm_trainer, data, research, force_linearised=True).result()
    g_linear = grads_of(warm_trainer)
    assert linear.metrics["linearised"] == 1.0
    assert ((g_research - g_linear).norm() / g_linear.norm()) <= 1e-5  # what a remote engine computes

    clear(warm_trainer)
    warm_trainer.forward_backward(data, research).result()  # autograd of its own objective, in the engine
    g_direct = grads_of(warm_trainer)

    clear(warm_trainer)
    run_loss(warm_trainer, data, base()).result()
    g_builtin = grads_of(warm_trainer)
    clear(warm_trainer)
    run_loss(warm_trainer, data, ExtraTermOnly()).result()
    g_extra = grads_of(warm_trainer)
    clear(warm_trainer)

    assert ((g_research - g_direct).norm() / g_direct.norm()) <= 1e-5
    assert ((g_research - (g_builtin + g_extra)).norm() / g_research.norm()) <= 1e-5  # linearity: its maths, exactly
    assert ((g_research - g_builtin).norm() / g_builtin.norm()) > 0.05  # and not the built-in's


class BatchNormalisedNLL(Loss):
    """Says nothing about itself: sum of NLL over the batch / the batch's weighted tokens."""

    name = "batch_nll"

    def compute(self, data, logprobs):
        w = batch_input(data, "weights")
        value = -(w * torch.cat(list(logprobs))).sum() / (w != 0).sum()
        return value, {"loss:sum": float(value.detach())}


def test_a_loss_that_says_nothing_is_whole_batch_and_non_linear():
    loss = BatchNormalisedNLL()
    assert not loss.datum_separable and not loss.linear_in_weights and loss.native_call() is None


def test_non_separable_loss_gradient_does_not_depend_on_micro_batching(warm_trainer):
    data = [sft_datum(t, prompt_len=2) for t in ([1, 40, 41, 42, 43, 2], [1, 50, 51, 52, 2], [1, 60, 61, 62, 63, 64, 65, 2])]
    engine = warm_trainer._engine
    saved = engine.micro_batch_tokens
    grads = {}
    try:
        for budget in (6, 4096):  # one sequence per micro-batch, then all in one
            engine.micro_batch_tokens = budget
            for path in ("run_loss", "engine"):
                clear(warm_trainer)
                if path == "run_loss":
                    run_loss(warm_trainer, data, BatchNormalisedNLL()).result()
                else:
                    warm_trainer.forward_backward(data, BatchNormalisedNLL()).result()
                grads[budget, path] = grads_of(warm_trainer)
    finally:
        engine.micro_batch_tokens = saved
        clear(warm_trainer)
    ref = grads[4096, "engine"]
    for key, g in grads.items():
        assert ((g - ref).norm() / ref.norm()) <= 1e-5, key
    # and it is the token-mean NLL: the same as cross-entropy aggregated by token_mean
    clear(warm_trainer)
    run_loss(warm_trainer, data, CrossEntropy(), aggregation="token_mean").result()
    g_ce = grads_of(warm_trainer)
    clear(warm_trainer)
    assert ((g_ce - ref).norm() / ref.norm()) <= 1e-5


def test_aggregation_around_a_loss_that_says_nothing():
    """token_mean / constant divide its value; seq_mean divides by its units (pairs for DPO)."""
    data = [sft_datum([1, 2, 3, 4], prompt_len=2), sft_datum([1, 5, 6], prompt_len=2)]
    lps = [torch.tensor([-1.0, -2.0, -3.0, -4.0]), torch.tensor([-0.5, -1.5, -2.5])]

    class SumNLL(Loss):
        name = "sum_nll"

        def compute(self, data, logprobs):
            v = -(batch_input(data, "weights") * torch.cat(list(logprobs))).sum()
            return v, {"loss:sum": float(v)}

    from rlkit.losses.aggregation import Aggregated

    total = SumNLL()(data, lps)[0].item()  # weights: [0,1,1,0] and [0,1,0] -> 2 + 3 + 1.5 = 6.5
    assert total == pytest.approx(6.5)
    assert Aggregated(SumNLL(), "token_mean")(data, lps)[0].item() == pytest.approx(6.5 / 3)
    assert Aggregated(SumNLL(), "constant", 10.0)(data, lps)[0].item() == pytest.approx(0.65)
    assert Aggregated(SumNLL(), "seq_mean")(data, lps)[0].item() == pytest.approx(6.5 / 2)


def test_sft_builds_its_loss_like_every_loop():
    """loss=NAME and extra_terms work in every loop: one builder."""
    loss = build_loss({"name": "cross_entropy", "extra_terms": [{"weight": 0.5, "name": "kl_penalty"}]})
    assert [type(p).__name__ for _, p in loss.parts] == ["CrossEntropy", "KLPenalty"] and loss.native_call() is None
