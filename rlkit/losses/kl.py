"""A KL penalty against a reference policy, as a loss term (e.g. ``PPO() + 0.01 * KLPenalty()``).

With ``d_t = log p_t - log ref_t`` on the sampled tokens:

- ``k1``: ``d_t`` (the naive estimator; its gradient is ``grad log p``);
- ``k3``: ``exp(-d_t) - 1 + d_t`` (Schulman 2020, "Approximating KL divergence"; non-negative,
  unbiased for KL(p || ref) under samples from p) — the estimator in the GRPO paper's loss
  (Shao et al. 2024, arXiv:2402.03300).

    L = sum_t w_t * k(d_t)

Needs the per-token ``ref_logprobs`` loss input (from a sampling client on the reference model:
``compute_logprobs``).
"""

from __future__ import annotations

import torch

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, batch_input


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    return torch.exp(-d) - 1 + d


class KLPenalty(Loss):
    """``sum w * k(log p - log ref)`` with ``k`` = k1 or k3."""

    name = "kl_penalty"
    required_inputs = ("target_tokens", "weights", "ref_logprobs")
    datum_separable = True
    linear_in_weights = True

    def __init__(self, estimator: str = "k3"):
        if estimator not in ("k1", "k3"):
            raise InvalidInputError(f"kl_penalty: estimator={estimator!r} must be 'k1' or 'k3'")
        self.estimator = estimator

    def compute(self, data, logprobs):
        lp = torch.cat(list(logprobs))
        ref = batch_input(data, "ref_logprobs").to(lp.device)
        w = batch_input(data, "weights").to(lp.device)
        per_token = kl_estimate(lp, ref, self.estimator)
        loss = (w * per_token).sum()
        mask = w != 0
        metrics = {"loss:sum": float(loss.detach()), "tokens:weighted": float(mask.sum())}
        if mask.any():
            metrics[f"kl_penalty/{self.estimator}:mean"] = float(per_token.detach()[mask].mean())
        return loss, metrics
