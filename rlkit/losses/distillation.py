"""On-policy distillation with a per-token reverse-KL advantage (Agarwal et al. 2024, GKD,
arXiv:2306.13649; Thinking Machines "On-policy distillation", 2025).

The student samples; the teacher scores the student's tokens. Each token gets the advantage

    A_t = A_task,t - lambda * (log q_student,t - log p_teacher,t)

(``logprobs`` = the student's sampler logprobs, ``teacher_logprobs`` = the teacher's, optional
``advantages`` = a task-reward advantage to mix in), and the policy-gradient loss is importance
sampling on those advantages, ``L = -sum_t w_t * (p_t / q_t) * A_t``. Minimising it lowers the
reverse KL ``KL(student || teacher)`` on the student's own samples.

Because it is importance sampling with precomputed advantages, it *is* the native
``importance_sampling`` built-in on a rewritten batch (:meth:`native_data` puts the advantages in
the datums), on every backend. A subclass that overrides :meth:`compute` runs linearised.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from rlkit.losses.base import Loss, datum_input
from rlkit.losses.importance_sampling import importance_sampling_objective, policy_metrics
from rlkit.types import Datum, TensorData


def reverse_kl_advantages(sampler_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """``-lambda * (log q_student - log p_teacher)`` per token."""
    return -kl_coef * (sampler_logprobs - teacher_logprobs)


class ReverseKLDistillation(Loss):
    """Importance-sampled policy gradient on reverse-KL advantages (+ optional task advantages)."""

    name = "reverse_kl_distillation"
    builtin = "importance_sampling"  # on the batch native_data() rewrites
    datum_separable = True
    linear_in_weights = True
    required_inputs = ("target_tokens", "weights", "logprobs", "teacher_logprobs")
    optional_inputs = ("temperature", "advantages")

    def __init__(self, kl_coef: float = 1.0):
        self.kl_coef = float(kl_coef)

    def advantages(self, datum: Datum) -> torch.Tensor:
        adv = reverse_kl_advantages(datum_input(datum, "logprobs"), datum_input(datum, "teacher_logprobs"), self.kl_coef)
        if "advantages" in datum.loss_fn_inputs:
            adv = adv + datum_input(datum, "advantages")
        return adv

    def compute(self, data, logprobs):
        lp = torch.cat(list(logprobs))
        q = torch.cat([datum_input(d, "logprobs") for d in data])
        adv = torch.cat([self.advantages(d) for d in data])
        w = torch.cat([datum_input(d, "weights") for d in data])
        loss = importance_sampling_objective(lp, q, adv, w).sum()
        metrics = {"loss:sum": float(loss.detach()), **policy_metrics(self.name, lp, q, w)}
        teacher = torch.cat([datum_input(d, "teacher_logprobs") for d in data])
        mask = w != 0
        if mask.any():
            metrics[f"{self.name}/reverse_kl:mean"] = float((q - teacher)[mask].mean())
        return loss, metrics

    def native_data(self, data: Sequence[Datum]) -> List[Datum]:
        """The batch for the ``importance_sampling`` built-in: advantages computed here."""
        out = []
        for d in data:
            inputs = {k: d.loss_fn_inputs[k] for k in ("target_tokens", "weights", "logprobs")}
            if "temperature" in d.loss_fn_inputs:
                inputs["temperature"] = d.loss_fn_inputs["temperature"]
            inputs["advantages"] = TensorData.from_torch(self.advantages(d))
            out.append(Datum(model_input=d.model_input, loss_fn_inputs=inputs))
        return out
