"""Cross-entropy (supervised learning / SFT).

    L = -sum_t w_t * log p(y_t | x_<=t)

``w`` (``weights``) masks prompt tokens (0) and may weight the rest; the linearised path of
custom losses also arrives here, as ``w = -dL/dlogp``.
"""

from __future__ import annotations

import torch

from rlkit.losses.base import Loss, batch_input


def cross_entropy_objective(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token loss ``-w * logp``."""
    return -weights * logprobs


class CrossEntropy(Loss):
    """Weighted negative log-likelihood of the target tokens (summed over tokens)."""

    name = "cross_entropy"
    builtin = "cross_entropy"
    datum_separable = True
    linear_in_weights = True

    def compute(self, data, logprobs):
        lp = torch.cat(list(logprobs))
        w = batch_input(data, "weights").to(lp.device)
        loss = cross_entropy_objective(lp, w).sum()
        weighted = float((w != 0).sum())
        metrics = {"loss:sum": float(loss.detach()), "tokens:weighted": weighted}
        if weighted:
            metrics["cross_entropy/nll:mean"] = float((-(lp.detach()) * (w != 0)).sum()) / weighted
        return loss, metrics
