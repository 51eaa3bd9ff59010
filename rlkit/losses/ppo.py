"""PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), with optional dual clip
(Ye et al. 2020, arXiv:1912.09729).

    r_t = p(y_t) / q(y_t)                      (log-ratio clamped to +-20 before exp)
    L   = -sum_t w_t * min(r_t A_t, clip(r_t, lo, hi) A_t)

``lo``/``hi`` are ratio bounds (``clip_low_threshold`` / ``clip_high_threshold``, default 0.8 /
1.2, i.e. epsilon = 0.2; DAPO's clip-higher uses hi = 1.28). With ``dual_clip = c > 1`` the
objective of tokens with A < 0 is additionally bounded below by ``c * A``:
``max(min(rA, clip(r)A), cA)``. Dual clip and off-policy corrections
(``correction={kind: tis|mis}``, :mod:`rlkit.losses.offpolicy`) are not part of the service
built-in, so a PPO with either runs through the linearised path.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from rlkit.errors import InvalidInputError
from rlkit.losses.base import NativeCall, check_ratio_bounds
from rlkit.losses.offpolicy import importance_ratio
from rlkit.losses.policy import PolicyLoss


def ppo_objective(
    logprobs: torch.Tensor,  # [N] trainer log p
    sampler_logprobs: torch.Tensor,  # [N] sampler log q
    advantages: torch.Tensor,  # [N]
    weights: torch.Tensor,  # [N]
    low: float,
    high: float,
    dual_clip: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss ``[N]`` and a mask of tokens where the clipped branch is active."""
    ratio = importance_ratio(logprobs, sampler_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, low, high) * advantages
    objective = torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        floor = dual_clip * advantages
        objective = torch.where(advantages < 0, torch.maximum(objective, floor), objective)
    active_clip = (clipped < unclipped).detach()
    return -weights * objective, active_clip


class PPO(PolicyLoss):
    """PPO's clipped surrogate — the service built-in ``ppo`` (without dual clip or correction)."""

    name = "ppo"
    builtin = "ppo"
    builtin_config_keys = ("clip_low_threshold", "clip_high_threshold")
    datum_separable = True
    linear_in_weights = True

    def __init__(self, clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2,
                 dual_clip: Optional[float] = None, correction: Any = None):
        super().__init__(correction)
        bounds = check_ratio_bounds(self.name, clip_low_threshold, clip_high_threshold)
        if dual_clip is not None and dual_clip <= 1.0:
            raise InvalidInputError(f"ppo: dual_clip={dual_clip} must be > 1 (e.g. 3.0)")
        self.clip_low_threshold, self.clip_high_threshold = bounds
        self.dual_clip = None if dual_clip is None else float(dual_clip)

    def native_call(self) -> Optional[NativeCall]:
        return None if self.dual_clip is not None else super().native_call()

    def compute(self, data, logprobs):
        batch, extra = self.policy_batch(data, logprobs)
        lp, q, adv, w = (batch.cat(k) for k in ("logprobs", "sampler_logprobs", "advantages", "weights"))
        per_token, clipped = ppo_objective(lp, q, adv, w, self.clip_low_threshold, self.clip_high_threshold, self.dual_clip)
        return self.finish(per_token, batch, {**extra, **self.clip_fraction(clipped, batch)})
