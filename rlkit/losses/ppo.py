"""PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), with optional dual clip
(Ye et al. 2020, arXiv:1912.09729).

    r_t = p(y_t) / q(y_t)
    L   = -sum_t w_t * min(r_t A_t, clip(r_t, lo, hi) A_t)

``lo``/``hi`` are ratio bounds (``clip_low_threshold`` / ``clip_high_threshold``, default 0.8 /
1.2, i.e. epsilon = 0.2; DAPO's clip-higher uses hi = 1.28). With ``dual_clip = c > 1`` the
objective of tokens with A < 0 is additionally bounded below by ``c * A``:
``max(min(rA, clip(r)A), cA)``. Dual clip is not a service built-in, so a PPO with dual clip runs
through the linearised path.
"""

from __future__ import annotations

from typing import Optional

import torch

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, batch_input, check_ratio_bounds
from rlkit.losses.importance_sampling import policy_metrics


def ppo_objective(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    low: float,
    high: float,
    dual_clip: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and a mask of tokens where the clipped branch is active."""
    ratio = torch.exp(logprobs - sampler_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, low, high) * advantages
    objective = torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        floor = dual_clip * advantages
        objective = torch.where(advantages < 0, torch.maximum(objective, floor), objective)
    active_clip = (clipped < unclipped).detach()
    return -weights * objective, active_clip


class PPO(Loss):
    """PPO's clipped surrogate — the service built-in ``ppo`` (without dual clip)."""

    name = "ppo"
    required_inputs = ("target_tokens", "weights", "logprobs", "advantages")

    def __init__(self, clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2, dual_clip: Optional[float] = None):
        check_ratio_bounds(self.name, clip_low_threshold, clip_high_threshold)
        if dual_clip is not None and dual_clip <= 1.0:
            raise InvalidInputError(f"ppo: dual_clip={dual_clip} must be > 1 (e.g. 3.0)")
        self.clip_low_threshold = float(clip_low_threshold)
        self.clip_high_threshold = float(clip_high_threshold)
        self.dual_clip = None if dual_clip is None else float(dual_clip)

    @property
    def builtin(self) -> Optional[str]:  # type: ignore[override]
        return "ppo" if self.dual_clip is None else None

    def builtin_config(self):
        return {"clip_low_threshold": self.clip_low_threshold, "clip_high_threshold": self.clip_high_threshold}

    def compute(self, data, logprobs):
        lp = torch.cat(list(logprobs))
        q, adv, w = (batch_input(data, k).to(lp.device) for k in ("logprobs", "advantages", "weights"))
        per_token, clipped = ppo_objective(lp, q, adv, w, self.clip_low_threshold, self.clip_high_threshold, self.dual_clip)
        loss = per_token.sum()
        metrics = {"loss:sum": float(loss.detach()), **policy_metrics(self.name, lp, q, w)}
        mask = w != 0
        if mask.any():
            metrics[f"{self.name}/clip_frac:mean"] = float(clipped[mask].float().mean())
        return loss, metrics
