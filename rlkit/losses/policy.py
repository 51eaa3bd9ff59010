"""The shared base of the policy-gradient losses (IS, PPO, CISPO, GSPO).

It owns what they have in common: the per-token inputs ``logprobs`` (the sampler's ``log q``) and
``advantages``, the clamped importance ratio (:func:`rlkit.losses.offpolicy.importance_ratio`),
an optional off-policy correction (``correction={kind: tis|mis, ...}``, see
:mod:`rlkit.losses.offpolicy`) and the sampler-vs-trainer diagnostics every RL step logs. Each
subclass keeps its maths in one short ``*_objective`` function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from rlkit.losses.base import Loss, NativeCall, datum_input
from rlkit.losses.offpolicy import OffPolicyCorrection, clamped_log_ratio, correction_factors
from rlkit.types import Datum


def sampler_trainer_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """THE sampler-trainer mismatch: KL(q || p) estimated on tokens sampled from q with Schulman's
    k3 estimator, ``mean(r - 1 - log r)`` with ``r = p / q`` and ``log_ratio = log p - log q``
    (unbiased, always >= 0). Every metric named ``kl_sampler_trainer`` / ``mismatch/kl_k3`` is this."""
    return (torch.exp(log_ratio) - 1 - log_ratio).mean()


def policy_metrics(name: str, lp: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> Dict[str, float]:
    """Sampler-vs-trainer diagnostics over weighted tokens: mean |logp - logq|, k3 KL(q||p), mean ratio."""
    mask = w != 0
    n = float(mask.sum())
    if not n:
        return {"tokens:weighted": 0.0}
    diff = clamped_log_ratio(lp.detach(), q)[mask]
    ratio = torch.exp(diff)
    return {
        "tokens:weighted": n,
        f"{name}/logprob_diff_abs:mean": float(diff.abs().mean()),
        f"{name}/kl_sampler_trainer:mean": float(sampler_trainer_kl(diff)),
        f"{name}/ratio:mean": float(ratio.mean()),
    }


@dataclass
class PolicyBatch:
    """A batch's policy-gradient inputs, per datum (``[T_i]`` each) and concatenated (``[N]``)."""

    logprobs: List[torch.Tensor]  # trainer log p, with gradient
    sampler_logprobs: List[torch.Tensor]  # log q
    advantages: List[torch.Tensor]
    weights: List[torch.Tensor]
    factors: Optional[List[torch.Tensor]]  # off-policy correction k (detached), or None

    def cat(self, name: str) -> torch.Tensor:
        return torch.cat(list(getattr(self, name)))

    def factor(self) -> Optional[torch.Tensor]:
        return None if self.factors is None else torch.cat(self.factors)


class PolicyLoss(Loss):
    """Base of IS, PPO, CISPO and GSPO: inputs, correction, metrics."""

    required_inputs = ("target_tokens", "weights", "logprobs", "advantages")

    def __init__(self, correction: Any = None):
        self.correction: Optional[OffPolicyCorrection] = OffPolicyCorrection.coerce(correction)

    def native_call(self) -> Optional[NativeCall]:
        """No built-in has an off-policy correction: with one, run linearised."""
        return None if self.correction is not None else super().native_call()

    def policy_batch(self, data: Sequence[Datum], logprobs: Sequence[torch.Tensor]) -> tuple[PolicyBatch, Dict[str, float]]:
        """The batch's inputs on ``logprobs``' device and the correction's factors and metric."""
        device = logprobs[0].device if len(logprobs) else None
        q = [datum_input(d, "logprobs").to(device) for d in data]
        adv = [datum_input(d, "advantages").to(device) for d in data]
        w = [datum_input(d, "weights").to(device) for d in data]
        factors, metrics = correction_factors(self.correction, self.name, logprobs, q, w)
        return PolicyBatch(list(logprobs), q, adv, w, factors), metrics

    def finish(self, per_token: torch.Tensor, batch: PolicyBatch, extra: Dict[str, float]) -> tuple[torch.Tensor, Dict[str, float]]:
        """Sum the (corrected) per-token losses ``[N]``; the standard metrics plus ``extra``."""
        factor = batch.factor()
        if factor is not None:
            per_token = per_token * factor
        loss = per_token.sum()
        lp, q, w = batch.cat("logprobs"), batch.cat("sampler_logprobs"), batch.cat("weights")
        return loss, {"loss:sum": float(loss.detach()), **policy_metrics(self.name, lp, q, w), **extra}

    def clip_fraction(self, active: torch.Tensor, batch: PolicyBatch) -> Dict[str, float]:
        """``<name>/clip_frac:mean`` over weighted tokens, from a boolean mask ``[N]``."""
        mask = batch.cat("weights") != 0
        return {f"{self.name}/clip_frac:mean": float(active[mask].float().mean())} if mask.any() else {}
