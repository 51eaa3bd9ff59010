"""GSPO, DPO/IPO, reverse-KL distillation, KL penalty, composition and aggregation: values and
gradients against hand-computed numbers."""

import math

import pytest
import torch

from rlkit.errors import ConfigError, InvalidInputError
from rlkit.losses import (
    DPO,
    GSPO,
    PPO,
    Aggregated,
    KLPenalty,
    ReverseKLDistillation,
    aggregate_direct,
    build_loss,
    compile_weights,
)
from rlkit.losses.ppo import ppo_objective
from rlkit.types import Datum, ModelInput


def datum(tokens, **inputs):
    n = len(tokens)
    base = {"target_tokens": list(tokens[1:]) + [0]}
    base.update({k: (v if isinstance(v, list) else [v] * n) for k, v in inputs.items()})
    return Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs=base)


def test_gspo_sequence_ratio_value_and_gradient():
    q = torch.tensor([-1.0, -2.0, -3.0])
    lp = torch.tensor([-0.9, -2.1, -5.0], requires_grad=True)
    w = [1.0, 1.0, 0.0]
    d = datum([1, 2, 3], weights=w, logprobs=q.tolist(), advantages=2.0)
    loss, _ = GSPO(clip_low_threshold=0.5, clip_high_threshold=1.5)([d], [lp])
    s = math.exp(((-0.9 + 1.0) + (-2.1 + 2.0)) / 2)  # = 1, inside the clip range
    assert loss.item() == pytest.approx(-s * 2.0, rel=1e-6)
    loss.backward()
    # d/dlp_t (-s A) = -A s * w_t / n
    assert lp.grad.tolist() == pytest.approx([-1.0, -1.0, 0.0], rel=1e-6)
    clipped, _ = GSPO(clip_low_threshold=0.5, clip_high_threshold=1.0001)([d], [torch.tensor([0.0, -2.0, -3.0])])
    assert clipped.item() == pytest.approx(-1.0001 * 2.0, rel=1e-6)  # s = e^0.5 clipped


def pair(lp_c, lp_r, ref_c, ref_r):
    chosen = datum([1, 5, 6], weights=[1.0, 1.0, 0.0], ref_logprobs=ref_c)
    rejected = datum([1, 7, 8], weights=[1.0, 1.0, 0.0], ref_logprobs=ref_r)
    return [chosen, rejected], [torch.tensor(lp_c, requires_grad=True), torch.tensor(lp_r, requires_grad=True)]


def test_dpo_value_gradient_and_metrics():
    data, lps = pair([-1.0, -1.0, -9.0], [-2.0, -2.0, -9.0], [-1.5, -1.5, 0.0], [-1.5, -1.5, 0.0])
    beta = 0.5
    loss, m = DPO(beta=beta)(data, lps)
    margin = (-2.0 - -3.0) - (-4.0 - -3.0)  # = 2
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-beta * margin))), rel=1e-6)
    loss.backward()
    sig = 1 / (1 + math.exp(beta * margin))  # dL/dmargin = -beta * sigmoid(-beta*margin)
    assert lps[0].grad.tolist() == pytest.approx([-beta * sig, -beta * sig, 0.0], rel=1e-5)
    assert lps[1].grad.tolist() == pytest.approx([beta * sig, beta * sig, 0.0], rel=1e-5)
    assert m["dpo/accuracy:mean"] == 1.0
    assert m["dpo/reward_margin:mean"] == pytest.approx(beta * margin)
    assert m["dpo/chosen_reward:mean"] == pytest.approx(beta * 1.0)
    assert m["dpo/rejected_reward:mean"] == pytest.approx(beta * -1.0)


def test_ipo_value():
    data, lps = pair([-1.0, -1.0, 0.0], [-2.0, -2.0, 0.0], [-1.5, -1.5, 0.0], [-1.5, -1.5, 0.0])
    loss, _ = DPO(beta=0.25, variant="ipo")(data, lps)
    assert loss.item() == pytest.approx((2.0 - 1 / (2 * 0.25)) ** 2)


def test_dpo_pairing_is_checked():
    data, _ = pair([0.0] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3)
    with pytest.raises(InvalidInputError, match="must be \\(chosen, rejected\\) pairs"):
        DPO().validate(data[:1])
    same = datum([1, 5, 6], weights=[1.0, 1.0, 0.0], ref_logprobs=0.0)
    with pytest.raises(InvalidInputError, match="pair 0 .* identical"):
        DPO().validate([same, same])
    empty = datum([1, 7, 8], weights=0.0, ref_logprobs=0.0)
    with pytest.raises(InvalidInputError, match="datum\\[1\\] \\(pair 0\\) has no weighted"):
        DPO().validate([data[0], empty])


def test_reverse_kl_advantages_and_native_rewrite():
    q = [-1.0, -2.0, -0.5]
    teacher = [-1.5, -1.0, -0.5]
    d = datum([1, 2, 3], weights=[1.0, 1.0, 0.0], logprobs=q, teacher_logprobs=teacher, advantages=[0.5, 0.5, 0.5])
    loss_fn = ReverseKLDistillation(kl_coef=2.0)
    adv = loss_fn.advantages(d)
    assert adv.tolist() == pytest.approx([-2.0 * 0.5 + 0.5, -2.0 * -1.0 + 0.5, 0.5])
    lp = torch.tensor(q, requires_grad=True)
    loss, m = loss_fn([d], [lp])
    assert loss.item() == pytest.approx(-(adv[0] + adv[1]).item(), rel=1e-6)  # ratios are 1
    native = loss_fn.native_data([d])[0]
    assert native.loss_fn_inputs["advantages"].tolist() == pytest.approx(adv.tolist())
    assert set(native.loss_fn_inputs) == {"target_tokens", "weights", "logprobs", "advantages"}
    assert m["reverse_kl_distillation/reverse_kl:mean"] == pytest.approx((0.5 + -1.0) / 2)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_penalty_estimators(estimator):
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = [-1.5, -1.0]
    d = datum([1, 2], weights=[1.0, 2.0], ref_logprobs=ref)
    loss, m = KLPenalty(estimator)([d], [lp])
    diffs = [0.5, -1.0]
    k = diffs if estimator == "k1" else [math.exp(-x) - 1 + x for x in diffs]
    assert loss.item() == pytest.approx(1.0 * k[0] + 2.0 * k[1], rel=1e-6)
    assert m[f"kl_penalty/{estimator}:mean"] == pytest.approx(sum(k) / 2, rel=1e-6)


def test_composition_equals_sum_of_parts():
    q = [-1.0, -2.0, -1.0]
    d = datum([1, 2, 3], weights=[1.0, 1.0, 0.0], logprobs=q, advantages=1.0, ref_logprobs=[-1.2, -1.8, -1.0])
    composite = PPO() + 0.1 * KLPenalty()
    lp1 = torch.tensor([-0.8, -2.5, -1.0], requires_grad=True)
    lp2 = lp1.detach().clone().requires_grad_(True)
    total, metrics = composite([d], [lp1])
    a, _ = PPO()([d], [lp2])
    b, _ = KLPenalty()([d], [lp2])
    assert total.item() == pytest.approx((a + 0.1 * b).item(), rel=1e-6)
    total.backward()
    (a + 0.1 * b).backward()
    assert torch.allclose(lp1.grad, lp2.grad)
    assert "ppo/clip_frac:mean" in metrics and "kl_penalty/k3:mean" in metrics
    assert set(composite.required_inputs) == {"target_tokens", "weights", "logprobs", "advantages", "ref_logprobs"}


def rl_batch():
    torch.manual_seed(0)
    data, lps = [], []
    for n, adv in ((4, 1.0), (6, -0.5), (3, 2.0)):
        w = [0.0] + [1.0] * (n - 2) + [0.0]
        q = (-torch.rand(n) * 3).tolist()
        data.append(datum(list(range(1, n + 1)), weights=w, logprobs=q, advantages=adv))
        lps.append((torch.tensor(q) + 0.3 * torch.randn(n)).requires_grad_(True))
    return data, lps


@pytest.mark.parametrize("mode, constant", [("sum", None), ("token_mean", None), ("seq_mean", None), ("constant", 64.0)])
def test_aggregation_formula_and_compiled_form(mode, constant):
    data, lps = rl_batch()
    direct_terms = []
    for d, lp in zip(data, lps):
        per_token, _ = ppo_objective(lp, d.loss_fn_inputs["logprobs"].to_torch(), d.loss_fn_inputs["advantages"].to_torch(), d.loss_fn_inputs["weights"].to_torch(), 0.8, 1.2)
        direct_terms.append(per_token)
    weights = [d.loss_fn_inputs["weights"].to_torch() for d in data]
    direct = aggregate_direct(direct_terms, weights, mode, constant)
    # the hand formula for token_mean / seq_mean
    sums = [t.sum().item() for t in direct_terms]
    counts = [int((w != 0).sum()) for w in weights]
    expected = {
        "sum": sum(sums),
        "token_mean": sum(sums) / sum(counts),
        "seq_mean": sum(s / n for s, n in zip(sums, counts)) / len(sums),
        "constant": sum(sums) / (constant or 1),
    }[mode]
    assert direct.item() == pytest.approx(expected, rel=1e-6)
    compiled, _ = PPO()(compile_weights(data, mode, constant), [lp.detach().requires_grad_(True) for lp in lps])
    assert compiled.item() == pytest.approx(direct.item(), rel=1e-6)
    wrapped, _ = Aggregated(PPO(), mode, constant)(data, lps)
    assert wrapped.item() == pytest.approx(direct.item(), rel=1e-6)


def test_aggregation_that_contradicts_the_loss_is_refused():
    with pytest.raises(InvalidInputError, match="gspo: aggregation='token_mean' contradicts"):
        Aggregated(GSPO(), "token_mean")
    with pytest.raises(InvalidInputError, match="needs a positive constant"):
        Aggregated(PPO(), "constant")
    with pytest.raises(InvalidInputError, match="must be one of"):
        Aggregated(PPO(), "mean")


def test_bad_inputs_are_named():
    d = datum([1, 2, 3], weights=1.0, logprobs=[-1.0, float("inf"), -1.0], advantages=1.0)
    with pytest.raises(InvalidInputError, match=r"datum\[0\].loss_fn_inputs\['logprobs'\]\[1\] is inf"):
        PPO().validate([d])
    with pytest.raises(InvalidInputError, match=r"missing loss_fn_inputs \['teacher_logprobs'\]"):
        ReverseKLDistillation().validate([datum([1, 2], weights=1.0, logprobs=-1.0)])
    with pytest.raises(InvalidInputError, match="clip_high_threshold=1.0"):
        GSPO(clip_high_threshold=1.0)


def test_registry_builds_by_name_target_and_terms():
    loss = build_loss({"name": "ppo", "clip_high_threshold": 1.28, "extra_terms": [{"weight": 0.01, "name": "kl_penalty", "estimator": "k1"}]})
    assert loss.parts[0][1].clip_high_threshold == 1.28 and loss.parts[1] [0] == 0.01
    assert isinstance(build_loss({"_target_": "rlkit.losses.cispo.CISPO", "clip_low_threshold": 0.5}).__class__, type)
    with pytest.raises(ConfigError, match="loss.clip_hi: not a parameter of PPO"):
        build_loss({"name": "ppo", "clip_hi": 1.3})
    with pytest.raises(ConfigError, match="unknown loss"):
        build_loss({"name": "grpo++"})
    with pytest.raises(ConfigError, match="cannot import module 'no'"):
        build_loss({"_target_": "no.such.Loss"})
