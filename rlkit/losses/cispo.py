"""CISPO: clipped importance-sampling policy optimisation (MiniMax-M1, arXiv:2506.13585).

    r_t = p(y_t) / q(y_t)                      (log-ratio clamped to +-20 before exp)
    L   = -sum_t w_t * sg[clip(r_t, lo, hi)] * A_t * log p(y_t)

The ratio is clipped and detached (``sg``), so every token keeps a REINFORCE gradient
``-w * clip(r) * A * grad log p``; unlike PPO no token's gradient is dropped by clipping. An
off-policy correction (``correction=``, :mod:`rlkit.losses.offpolicy`) runs linearised.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.losses.base import check_ratio_bounds
from rlkit.losses.offpolicy import importance_ratio
from rlkit.losses.policy import PolicyLoss


def cispo_objective(
    logprobs: torch.Tensor,  # [N]
    sampler_logprobs: torch.Tensor,  # [N]
    advantages: torch.Tensor,  # [N]
    weights: torch.Tensor,  # [N]
    low: float,
    high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss ``[N]`` and a mask of tokens whose ratio was clipped."""
    ratio = importance_ratio(logprobs.detach(), sampler_logprobs)
    clipped_ratio = torch.clamp(ratio, low, high)
    return -weights * clipped_ratio * advantages * logprobs, (clipped_ratio != ratio)


class CISPO(PolicyLoss):
    """CISPO — the service built-in ``cispo``."""

    name = "cispo"
    builtin = "cispo"
    builtin_config_keys = ("clip_low_threshold", "clip_high_threshold")
    datum_separable = True
    linear_in_weights = True

    def __init__(self, clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2, correction: Any = None):
        super().__init__(correction)
        bounds = check_ratio_bounds(self.name, clip_low_threshold, clip_high_threshold)
        self.clip_low_threshold, self.clip_high_threshold = bounds

    def compute(self, data, logprobs):
        batch, extra = self.policy_batch(data, logprobs)
        lp, q, adv, w = (batch.cat(k) for k in ("logprobs", "sampler_logprobs", "advantages", "weights"))
        per_token, clipped = cispo_objective(lp, q, adv, w, self.clip_low_threshold, self.clip_high_threshold)
        return self.finish(per_token, batch, {**extra, **self.clip_fraction(clipped, batch)})
