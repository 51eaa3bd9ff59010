"""GSPO: group sequence policy optimisation (Zheng et al. 2025, Qwen; arXiv:2507.18071).

The importance ratio is taken per *sequence*, length-normalised:

    s_i = exp( (1/|y_i|) * sum_t w_t (log p_t - log q_t) )           (|y_i| = weighted tokens)
    L   = -sum_i min(s_i A_i, clip(s_i, lo, hi) A_i)

``A_i`` is the sequence's advantage (read from its first weighted token). The paper's clip range
is tiny because s_i is a geometric mean: ratio bounds 1 - 3e-4 / 1 + 4e-4 by default. GSPO fixes
its own per-sequence normalisation, so a token-mean aggregation contradicts it (refused);
``sum`` and ``seq_mean`` are fine.
"""

from __future__ import annotations

import torch

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, check_ratio_bounds, datum_input


def gspo_objective(logprobs, sampler_logprobs, advantage, weights, low, high):
    """One sequence's loss and whether its clipped branch is active."""
    mask = weights != 0
    n = mask.sum().clamp(min=1)
    log_ratio = ((logprobs - sampler_logprobs) * mask).sum() / n
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, low, high) * advantage
    return -torch.minimum(unclipped, clipped), bool(clipped < unclipped)


class GSPO(Loss):
    """Sequence-level clipped policy gradient."""

    name = "gspo"
    required_inputs = ("target_tokens", "weights", "logprobs", "advantages")
    linear_in_weights = False
    allowed_aggregations = ("sum", "seq_mean")

    def __init__(self, clip_low_threshold: float = 1 - 3e-4, clip_high_threshold: float = 1 + 4e-4):
        check_ratio_bounds(self.name, clip_low_threshold, clip_high_threshold)
        self.clip_low_threshold = float(clip_low_threshold)
        self.clip_high_threshold = float(clip_high_threshold)

    def compute(self, data, logprobs):
        total = logprobs[0].new_zeros(())
        clipped = 0
        for datum, lp in zip(data, logprobs):
            w = datum_input(datum, "weights")
            adv = datum_input(datum, "advantages")
            nz = (w != 0).nonzero()
            if len(nz) == 0:
                continue
            loss_i, is_clipped = gspo_objective(
                lp, datum_input(datum, "logprobs"), adv[nz[0, 0]], w, self.clip_low_threshold, self.clip_high_threshold
            )
            total = total + loss_i
            clipped += is_clipped
        return total, {"loss:sum": float(total.detach()), "gspo/seq_clip_frac:mean": clipped / max(len(data), 1), "tokens:weighted": float(len(data))}

    def validate_batch(self, data) -> None:
        for i, d in enumerate(data):
            if not bool((datum_input(d, "weights") != 0).any()):
                raise InvalidInputError(f"gspo: datum[{i}] has no weighted tokens (its sequence ratio is undefined)")
