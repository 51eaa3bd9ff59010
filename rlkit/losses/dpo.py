"""DPO: direct preference optimisation (Rafailov et al. 2023, arXiv:2305.18290), with the IPO
variant (Azar et al. 2023, arXiv:2310.12036).

The batch is a list of pairs: datum ``2k`` is the chosen response, datum ``2k+1`` the rejected
one, both with the same prompt. With sequence logprobs ``S = sum_t w_t log p_t`` under the policy
and ``R`` under the frozen reference (the ``ref_logprobs`` input), the implicit rewards are
``r_c = beta (S_c - R_c)``, ``r_r = beta (S_r - R_r)`` and

    DPO:  L = -sum_k log sigmoid(r_c - r_r)
    IPO:  L =  sum_k ((S_c - R_c) - (S_r - R_r) - 1 / (2 beta))^2

DPO couples the two datums of a pair, so it is not a native built-in anywhere: it runs through the
linearised path (one forward, the loss and its gradient on the client, then a weighted
cross-entropy backward).
"""

from __future__ import annotations

from typing import ClassVar, Tuple

import torch
import torch.nn.functional as F

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, datum_input


class DPO(Loss):
    """Pairwise preference loss on (chosen, rejected) consecutive datums."""

    name = "dpo"
    required_inputs = ("target_tokens", "weights", "ref_logprobs")
    allowed_aggregations = ("sum", "seq_mean")  # seq_mean: the mean over pairs
    #: the objectives ``variant`` chooses (``rlkit.loops.dpo.DPOVariant`` is derived from this)
    variants: ClassVar[Tuple[str, ...]] = ("dpo", "ipo")

    def __init__(self, beta: float = 0.1, variant: str = "dpo"):
        if beta <= 0:
            raise InvalidInputError(f"dpo: beta={beta} must be > 0")
        if variant not in self.variants:
            raise InvalidInputError(f"dpo: variant={variant!r} must be one of {list(self.variants)}")
        self.beta = float(beta)
        self.variant = variant

    def aggregation_units(self, data) -> int:
        """``seq_mean`` averages over pairs."""
        return len(data) // 2

    def validate_batch(self, data) -> None:
        if len(data) % 2:
            raise InvalidInputError(f"dpo: the batch has {len(data)} datums; it must be (chosen, rejected) pairs")
        for k in range(0, len(data), 2):
            chosen, rejected = data[k], data[k + 1]
            for i, d in ((k, chosen), (k + 1, rejected)):
                if not bool((datum_input(d, "weights") != 0).any()):
                    raise InvalidInputError(f"dpo: datum[{i}] (pair {k // 2}) has no weighted response tokens")
            if chosen.model_input.to_ints() == rejected.model_input.to_ints():
                raise InvalidInputError(f"dpo: pair {k // 2} (datums {k}, {k + 1}) has identical chosen and rejected sequences")

    def compute(self, data, logprobs):
        policy = torch.stack([(datum_input(d, "weights").to(lp) * lp).sum() for d, lp in zip(data, logprobs)])
        ref = torch.stack([(datum_input(d, "weights") * datum_input(d, "ref_logprobs")).sum() for d in data]).to(policy)
        log_ratio = policy - ref
        chosen, rejected = log_ratio[0::2], log_ratio[1::2]
        margin = chosen - rejected
        if self.variant == "ipo":
            per_pair = (margin - 1.0 / (2.0 * self.beta)) ** 2
        else:
            per_pair = -F.logsigmoid(self.beta * margin)
        loss = per_pair.sum()
        m = margin.detach()
        metrics = {
            "loss:sum": float(loss.detach()),
            "tokens:weighted": float(len(m)),
            "dpo/accuracy:mean": float((m > 0).float().mean()),
            "dpo/reward_margin:mean": float((self.beta * m).mean()),
            "dpo/chosen_reward:mean": float((self.beta * chosen.detach()).mean()),
            "dpo/rejected_reward:mean": float((self.beta * rejected.detach()).mean()),
        }
        return loss, metrics
