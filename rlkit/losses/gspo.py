"""GSPO: group sequence policy optimisation (Zheng et al. 2025, Qwen; arXiv:2507.18071).

The importance ratio is taken per *sequence*, length-normalised:

    s_i = exp( clamp((1/|y_i|) * sum_t w_t (log p_t - log q_t), -20, 20) )   (|y_i| = weighted tokens)
    L   = -sum_i min(s_i A_i, clip(s_i, lo, hi) A_i)

``A_i`` is the sequence's advantage (read from its first weighted token). The paper's clip range
is tiny because s_i is a geometric mean: ratio bounds 1 - 3e-4 / 1 + 4e-4 by default. GSPO fixes
its own per-sequence normalisation, so a token-mean aggregation contradicts it (refused);
``sum`` and ``seq_mean`` are fine. With an off-policy correction each sequence's term is
multiplied by its factor: at ``sequence``/``geometric`` level that sequence's, at ``token`` level
the mean of its tokens' factors (the fraction of it kept, for ``mis``).
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.errors import InvalidInputError
from rlkit.losses.base import check_ratio_bounds, datum_input
from rlkit.losses.offpolicy import LOG_RATIO_CLAMP
from rlkit.losses.policy import PolicyLoss, policy_metrics


def gspo_objective(logprobs, sampler_logprobs, advantage, weights, low, high):
    """One sequence's loss (``[T]`` inputs, scalar advantage) and whether its clipped branch is active."""
    mask = weights != 0
    n = mask.sum().clamp(min=1)
    log_ratio = torch.clamp(((logprobs - sampler_logprobs) * mask).sum() / n, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, low, high) * advantage
    return -torch.minimum(unclipped, clipped), bool(clipped < unclipped)


class GSPO(PolicyLoss):
    """Sequence-level clipped policy gradient (a sum of per-sequence terms, not linear in ``w``)."""

    name = "gspo"
    datum_separable = True
    allowed_aggregations = ("sum", "seq_mean")

    def __init__(self, clip_low_threshold: float = 1 - 3e-4, clip_high_threshold: float = 1 + 4e-4, correction: Any = None):
        super().__init__(correction)
        bounds = check_ratio_bounds(self.name, clip_low_threshold, clip_high_threshold)
        self.clip_low_threshold, self.clip_high_threshold = bounds

    def compute(self, data, logprobs):
        batch, extra = self.policy_batch(data, logprobs)
        total = logprobs[0].new_zeros(())
        clipped = 0
        for i, (lp, q, adv, w) in enumerate(zip(batch.logprobs, batch.sampler_logprobs, batch.advantages, batch.weights)):
            nz = (w != 0).nonzero()
            if len(nz) == 0:
                continue
            loss_i, is_clipped = gspo_objective(lp, q, adv[nz[0, 0]], w, self.clip_low_threshold, self.clip_high_threshold)
            if batch.factors is not None:
                loss_i = loss_i * batch.factors[i][w != 0].mean()
            total = total + loss_i
            clipped += is_clipped
        lp, q, w = batch.cat("logprobs"), batch.cat("sampler_logprobs"), batch.cat("weights")
        metrics = {**policy_metrics(self.name, lp, q, w), **extra}
        metrics.update({"loss:sum": float(total.detach()), "gspo/seq_clip_frac:mean": clipped / max(len(data), 1),
                        "tokens:weighted": float(len(data))})
        return total, metrics

    def validate_batch(self, data) -> None:
        for i, d in enumerate(data):
            if not bool((datum_input(d, "weights") != 0).any()):
                raise InvalidInputError(f"gspo: datum[{i}] has no weighted tokens (its sequence ratio is undefined)")
