"""Importance-sampled policy gradient (REINFORCE with off-policy correction).

    r_t = p(y_t) / q(y_t)                (trainer over sampler probability)
    L   = -sum_t w_t * r_t * A_t

Its gradient is ``-w r A grad log p``, the on-policy REINFORCE gradient when p = q (Williams
1992), corrected by the ratio when the sampler lags the trainer.
"""

from __future__ import annotations

import torch

from rlkit.losses.base import Loss, batch_input


def importance_sampling_objective(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Per-token loss ``-w * exp(logp - logq) * A``."""
    ratio = torch.exp(logprobs - sampler_logprobs)
    return -weights * ratio * advantages


def policy_metrics(name: str, lp: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> dict:
    """Sampler-vs-trainer diagnostics over weighted tokens: mean |logp - logq|, k3 KL(q||p)."""
    mask = w != 0
    n = float(mask.sum())
    if not n:
        return {"tokens:weighted": 0.0}
    diff = (lp.detach() - q)[mask]
    ratio = torch.exp(diff)
    return {
        "tokens:weighted": n,
        f"{name}/logprob_diff_abs:mean": float(diff.abs().mean()),
        f"{name}/kl_sampler_trainer:mean": float((ratio - 1 - diff).mean()),
        f"{name}/ratio:mean": float(ratio.mean()),
    }


class ImportanceSampling(Loss):
    """``-sum w * (p/q) * A`` — the service built-in ``importance_sampling``."""

    name = "importance_sampling"
    builtin = "importance_sampling"
    required_inputs = ("target_tokens", "weights", "logprobs", "advantages")

    def compute(self, data, logprobs):
        lp = torch.cat(list(logprobs))
        q, adv, w = (batch_input(data, k).to(lp.device) for k in ("logprobs", "advantages", "weights"))
        loss = importance_sampling_objective(lp, q, adv, w).sum()
        return loss, {"loss:sum": float(loss.detach()), **policy_metrics(self.name, lp, q, w)}
