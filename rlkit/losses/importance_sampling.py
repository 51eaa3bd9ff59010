"""Importance-sampled policy gradient (REINFORCE with off-policy correction).

    r_t = p(y_t) / q(y_t)                (trainer over sampler probability; log-ratio clamped to +-20)
    L   = -sum_t w_t * r_t * A_t

Its gradient is ``-w r A grad log p``, the on-policy REINFORCE gradient when p = q (Williams
1992), corrected by the ratio when the sampler lags the trainer. With
``correction={kind: tis, cap: C}`` the ratio's weight on each token is capped at ``C``; with
``mis`` tokens whose ratio leaves a band are dropped (:mod:`rlkit.losses.offpolicy`).
"""

from __future__ import annotations

import torch

from rlkit.losses.offpolicy import importance_ratio
from rlkit.losses.policy import PolicyLoss, policy_metrics  # noqa: F401  (policy_metrics: re-exported)


def importance_sampling_objective(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Per-token loss ``-w * r * A`` (all ``[N]``)."""
    return -weights * importance_ratio(logprobs, sampler_logprobs) * advantages


class ImportanceSampling(PolicyLoss):
    """``-sum w * (p/q) * A`` — the service built-in ``importance_sampling``."""

    name = "importance_sampling"
    builtin = "importance_sampling"
    datum_separable = True
    linear_in_weights = True

    def compute(self, data, logprobs):
        batch, extra = self.policy_batch(data, logprobs)
        lp, q, adv, w = (batch.cat(k) for k in ("logprobs", "sampler_logprobs", "advantages", "weights"))
        return self.finish(importance_sampling_objective(lp, q, adv, w), batch, extra)
