"""The four built-in losses against hand-computed values and gradients."""

import math

import pytest
import torch

from rlkit.errors import InvalidInputError
from rlkit.losses import CISPO, PPO, CrossEntropy, ImportanceSampling, builtin_loss
from rlkit.types import Datum, ModelInput


def datum(n, **inputs):
    base = {"target_tokens": [1] * n}
    base.update(inputs)
    return Datum(model_input=ModelInput.from_ints([1] * n), loss_fn_inputs=base)


def test_cross_entropy_value_and_gradient():
    lp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    d = datum(3, weights=[0.0, 1.0, 2.0])
    loss, metrics = CrossEntropy()([d], [lp])
    assert loss.item() == pytest.approx(2.0 + 1.0)  # -(0*-1 + 1*-2 + 2*-0.5)
    loss.backward()
    assert lp.grad.tolist() == [-0.0, -1.0, -2.0]
    assert metrics["loss:sum"] == pytest.approx(3.0)


def test_importance_sampling_value_and_gradient():
    lp = torch.tensor([math.log(0.5), math.log(0.2)], requires_grad=True)
    q = [math.log(0.25), math.log(0.2)]
    d = datum(2, weights=[1.0, 1.0], logprobs=q, advantages=[1.0, -2.0])
    loss, _ = ImportanceSampling()([d], [lp])
    # r = [2, 1]; loss = -(2*1 + 1*-2) = 0
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    loss.backward()
    # d/dlogp (-w r A) = -w r A
    assert lp.grad.tolist() == pytest.approx([-2.0, 2.0])


def test_ppo_clipped_and_unclipped_tokens():
    # ratios: 1.5 (A>0: clipped at 1.2), 0.5 (A<0: clipped at 0.8 -> min picks 0.8*A), 1.0 (unclipped), w=0 token
    ratios = torch.tensor([1.5, 0.5, 1.0, 3.0])
    q = torch.log(torch.tensor([0.2, 0.4, 0.3, 0.1]))
    lp = (q + torch.log(ratios)).clone().requires_grad_(True)
    adv = [1.0, -1.0, 2.0, 5.0]
    d = datum(4, weights=[1.0, 1.0, 1.0, 0.0], logprobs=q.tolist(), advantages=adv)
    loss, metrics = PPO()([d], [lp])
    # objectives: min(1.5, 1.2)=1.2 ; min(-0.5, -0.8)=-0.8 ; 2.0 ; masked
    assert loss.item() == pytest.approx(-(1.2 - 0.8 + 2.0), rel=1e-5)
    loss.backward()
    # clipped tokens get no gradient; unclipped: -w * r * A
    assert lp.grad.tolist() == pytest.approx([0.0, 0.0, -2.0, 0.0], abs=1e-6)
    assert metrics["ppo/clip_frac:mean"] == pytest.approx(2 / 3)


def test_ppo_dual_clip_bounds_negative_advantages():
    q = torch.log(torch.tensor([0.1]))
    lp = (q + math.log(10.0)).clone().requires_grad_(True)  # ratio 10, A=-1
    d = datum(1, weights=[1.0], logprobs=q.tolist(), advantages=[-1.0])
    plain, _ = PPO()([d], [lp])
    dual, _ = PPO(dual_clip=3.0)([d], [lp])
    assert plain.item() == pytest.approx(10.0, rel=1e-5)  # -min(-10, -1.2)
    assert dual.item() == pytest.approx(3.0, rel=1e-5)  # -max(-10, -3)
    assert PPO(dual_clip=3.0).native_call() is None and PPO().native_call().name == "ppo"


def test_cispo_keeps_gradient_through_clipped_tokens():
    ratios = torch.tensor([2.0, 1.0])
    q = torch.log(torch.tensor([0.2, 0.3]))
    lp = (q + torch.log(ratios)).clone().requires_grad_(True)
    d = datum(2, weights=[1.0, 1.0], logprobs=q.tolist(), advantages=[1.0, -1.0])
    loss, metrics = CISPO()([d], [lp])
    expected = -(1.2 * 1.0 * lp[0].item() + 1.0 * -1.0 * lp[1].item())
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([-1.2, 1.0], rel=1e-5)
    assert metrics["cispo/clip_frac:mean"] == pytest.approx(0.5)


def test_builtin_loss_by_name_and_config():
    loss = builtin_loss("ppo", {"clip_high_threshold": 1.28})
    assert isinstance(loss, PPO) and loss.clip_high_threshold == 1.28 and loss.clip_low_threshold == 0.8
    with pytest.raises(InvalidInputError, match="unknown loss_fn 'dpo'"):
        builtin_loss("dpo")
    with pytest.raises(InvalidInputError, match="unknown loss_fn_config key 'clip'"):
        builtin_loss("ppo", {"clip": 0.2})
    with pytest.raises(InvalidInputError, match="clip_high_threshold=0.9"):
        builtin_loss("cispo", {"clip_high_threshold": 0.9})
    with pytest.raises(InvalidInputError, match="clip_low_threshold=1.0"):
        PPO(clip_low_threshold=1.0)
