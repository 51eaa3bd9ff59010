"""CISPO: clipped importance-sampling policy optimisation (MiniMax-M1, arXiv:2506.13585).

    r_t = p(y_t) / q(y_t)
    L   = -sum_t w_t * sg[clip(r_t, lo, hi)] * A_t * log p(y_t)

The ratio is clipped and detached (``sg``), so every token keeps a REINFORCE gradient
``-w * clip(r) * A * grad log p``; unlike PPO no token's gradient is dropped by clipping.
"""

from __future__ import annotations

import torch

from rlkit.losses.base import Loss, batch_input, check_ratio_bounds
from rlkit.losses.importance_sampling import policy_metrics


def cispo_objective(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    low: float,
    high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and a mask of tokens whose ratio was clipped."""
    ratio = torch.exp(logprobs.detach() - sampler_logprobs)
    clipped_ratio = torch.clamp(ratio, low, high)
    return -weights * clipped_ratio * advantages * logprobs, (clipped_ratio != ratio)


class CISPO(Loss):
    """CISPO — the service built-in ``cispo``."""

    name = "cispo"
    builtin = "cispo"
    required_inputs = ("target_tokens", "weights", "logprobs", "advantages")

    def __init__(self, clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2):
        check_ratio_bounds(self.name, clip_low_threshold, clip_high_threshold)
        self.clip_low_threshold = float(clip_low_threshold)
        self.clip_high_threshold = float(clip_high_threshold)

    def builtin_config(self):
        return {"clip_low_threshold": self.clip_low_threshold, "clip_high_threshold": self.clip_high_threshold}

    def compute(self, data, logprobs):
        lp = torch.cat(list(logprobs))
        q, adv, w = (batch_input(data, k).to(lp.device) for k in ("logprobs", "advantages", "weights"))
        per_token, clipped = cispo_objective(lp, q, adv, w, self.clip_low_threshold, self.clip_high_threshold)
        loss = per_token.sum()
        metrics = {"loss:sum": float(loss.detach()), **policy_metrics(self.name, lp, q, w)}
        mask = w != 0
        if mask.any():
            metrics[f"{self.name}/clip_frac:mean"] = float(clipped[mask].float().mean())
        return loss, metrics
