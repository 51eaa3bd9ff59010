"""A research loss in user code: PPO with a wider upper clip for positive advantages only.

DAPO's "clip-higher" (Yu et al. 2025, arXiv:2503.14476) raises the upper ratio bound to keep
exploration alive; this variant raises it only where the advantage is positive (the only place the
upper bound binds), leaving the pessimistic bound for negative advantages untouched:

    hi_t = positive_clip_high if A_t > 0 else clip_high_threshold
    L    = -sum_t w_t * min(r_t A_t, clip(r_t, lo, hi_t) A_t)

It overrides one method of :class:`rlkit.losses.PPO`, ``compute``, and nothing else. A subclass
never inherits ``builtin`` (see :class:`rlkit.losses.Loss`), so ``run_loss`` sends it through the
linearised path on every backend: its own ``compute`` is what trains.
"""

import torch

from rlkit.losses import PPO, batch_input
from rlkit.losses.offpolicy import importance_ratio
from rlkit.losses.policy import policy_metrics


class AsymmetricClipPPO(PPO):
    name = "asymmetric_ppo"

    def __init__(self, clip_low_threshold=0.8, clip_high_threshold=1.2, positive_clip_high=1.28):
        super().__init__(clip_low_threshold, clip_high_threshold)
        self.positive_clip_high = float(positive_clip_high)

    def compute(self, data, logprobs):
        lp = torch.cat(list(logprobs))
        q, adv, w = (batch_input(data, k) for k in ("logprobs", "advantages", "weights"))
        ratio = importance_ratio(lp, q)  # exp of the clamped log-ratio, as the built-ins compute it
        high = torch.where(adv > 0, torch.full_like(adv, self.positive_clip_high), torch.full_like(adv, self.clip_high_threshold))
        clipped = torch.minimum(torch.maximum(ratio, torch.full_like(ratio, self.clip_low_threshold)), high)
        objective = torch.minimum(ratio * adv, clipped * adv)
        loss = -(w * objective).sum()
        metrics = {"loss:sum": float(loss.detach()), **policy_metrics(self.name, lp, q, w)}
        mask = w != 0
        if mask.any():
            metrics[f"{self.name}/clip_frac:mean"] = float(((clipped * adv) < (ratio * adv))[mask].float().mean())
        return loss, metrics
