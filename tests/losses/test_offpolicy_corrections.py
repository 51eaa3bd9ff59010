"""Off-policy corrections (TIS / MIS, token and sequence level) and the log-ratio clamp, against
hand-computed values."""

import math

import pytest
import torch

from rlkit.errors import InvalidInputError
from rlkit.losses import CISPO, GSPO, PPO, ImportanceSampling, build_loss
from rlkit.losses.offpolicy import LOG_RATIO_CLAMP, OffPolicyCorrection
from rlkit.types import Datum, ModelInput

Q = [0.5, 0.2, 0.1]  # sampler probabilities of three tokens
RHO = [1.0, 3.0, 0.25]  # trainer / sampler ratios


def datum(advantage=1.0):
    n = len(Q)
    return Datum(model_input=ModelInput.from_ints(list(range(1, n + 1))), loss_fn_inputs={
        "target_tokens": [2, 3, 0], "weights": [1.0] * n, "logprobs": [math.log(q) for q in Q], "advantages": [advantage] * n})


def trainer_logprobs():
    return torch.tensor([math.log(q * r) for q, r in zip(Q, RHO)], requires_grad=True)


def value_and_grad(loss, advantage=1.0):
    lp = trainer_logprobs()
    value, metrics = loss([datum(advantage)], [lp])
    value.backward()
    return value.item(), lp.grad.tolist(), metrics


def test_importance_sampling_with_and_without_truncation():
    v, g, _ = value_and_grad(ImportanceSampling())
    assert v == pytest.approx(-(1 + 3 + 0.25))
    assert g == pytest.approx([-1.0, -3.0, -0.25])  # d(-r A)/dlogp = -r A
    v, g, m = value_and_grad(ImportanceSampling(correction={"kind": "tis", "cap": 2.0}))
    assert v == pytest.approx(-(1 + 2 + 0.25))  # the weight min(rho, C)
    assert g == pytest.approx([-1.0, -2.0, -0.25])
    assert m["importance_sampling/tis_truncated_frac:mean"] == pytest.approx(1 / 3)


def test_masked_importance_sampling_token_level():
    v, g, m = value_and_grad(ImportanceSampling(correction={"kind": "mis", "low": 0.5, "high": 2.0}))
    assert v == pytest.approx(-1.0) and g == pytest.approx([-1.0, 0.0, 0.0])
    assert m["importance_sampling/mis_masked_frac:mean"] == pytest.approx(2 / 3)


def test_sequence_and_geometric_levels():
    # sequence ratio = 1 * 3 * 0.25 = 0.75, geometric = 0.75 ** (1/3) = 0.909
    v, _, m = value_and_grad(ImportanceSampling(correction={"kind": "mis", "level": "sequence", "low": 0.8, "high": 2.0}))
    assert v == pytest.approx(0.0) and m["importance_sampling/mis_masked_frac:mean"] == pytest.approx(1.0)
    v, _, m = value_and_grad(ImportanceSampling(correction={"kind": "mis", "level": "geometric", "low": 0.8, "high": 2.0}))
    assert v == pytest.approx(-4.25) and m["importance_sampling/mis_masked_frac:mean"] == 0.0
    v, _, _ = value_and_grad(ImportanceSampling(correction={"kind": "tis", "level": "sequence", "cap": 0.5}))
    assert v == pytest.approx(-4.25 * 0.5 / 0.75)  # every token scaled by min(1, C / 0.75)


def test_ppo_with_truncation_caps_the_negative_advantage_weight():
    # A = -1: PPO keeps the unclipped branch r*A for the rho=3 token (min(-3, -1.2) = -3)
    v, g, _ = value_and_grad(PPO(), advantage=-1.0)
    assert v == pytest.approx(1.0 + 3.0 + 0.8)  # tokens: min(-1,-1)=-1, -3, min(-0.25, -0.8)=-0.8
    assert g == pytest.approx([1.0, 3.0, 0.0])
    v, g, _ = value_and_grad(PPO(correction={"kind": "tis", "cap": 2.0}), advantage=-1.0)
    assert v == pytest.approx(1.0 + 2.0 + 0.8)  # (C / rho) * 3 = 2
    assert g == pytest.approx([1.0, 2.0, 0.0])  # the rho=3 token's gradient weight is capped at C = 2


def test_cispo_and_gspo_accept_corrections():
    v, g, _ = value_and_grad(CISPO(correction={"kind": "mis", "low": 0.5, "high": 2.0}))
    # CISPO: -sg[clip(r)] * A * logp on the one kept token (rho = 1)
    assert v == pytest.approx(-math.log(0.5)) and g == pytest.approx([-1.0, 0.0, 0.0])
    plain, _, _ = value_and_grad(GSPO(0.5, 2.0))
    masked, _, _ = value_and_grad(GSPO(0.5, 2.0, correction={"kind": "mis", "low": 0.5, "high": 2.0}))
    assert masked == pytest.approx(plain / 3)  # token level: the sequence keeps 1 of its 3 tokens


def test_corrections_are_never_sent_as_the_builtin():
    assert PPO().native_call() is not None
    for loss in (PPO(correction="tis"), ImportanceSampling(correction={"kind": "mis"}), CISPO(correction="tis")):
        assert loss.native_call() is None


def test_corrections_from_a_config_and_bad_ones_refused():
    loss = build_loss({"name": "ppo", "correction": {"kind": "tis", "cap": 3, "level": "geometric"}})
    assert loss.correction == OffPolicyCorrection(kind="tis", level="geometric", cap=3.0)
    for bad, word in (({"kind": "clip"}, "kind"), ({"kind": "tis", "level": "batch"}, "level"), ({"kind": "tis", "cap": -1}, "cap"),
                      ({"kind": "mis", "low": 1.5, "high": 2.0}, "band"), ({"kind": "tis", "cup": 2}, "cup"), ({"cap": 2.0}, "kind")):
        with pytest.raises(Exception, match=word):
            build_loss({"name": "ppo", "correction": bad})
    with pytest.raises(InvalidInputError):
        OffPolicyCorrection(kind="tis", cap=float("inf"))


@pytest.mark.parametrize("loss", [ImportanceSampling(), PPO(), CISPO(), GSPO()])
def test_log_ratio_is_clamped_before_exp(loss):
    """A trainer logprob 1000 nats above the sampler's gives a finite loss, not inf/nan."""
    d = datum(advantage=-1.0)
    lp = torch.tensor([math.log(q) + 1000.0 for q in Q], requires_grad=True)
    value, _ = loss([d], [lp])
    value.backward()
    assert math.isfinite(value.item()) and bool(torch.isfinite(lp.grad).all())
    if isinstance(loss, ImportanceSampling):
        assert value.item() == pytest.approx(3 * math.exp(LOG_RATIO_CLAMP), rel=1e-5)
