"""Importance ratios for the policy-gradient losses, and off-policy corrections.

**The ratio.** Every policy loss (IS, PPO, CISPO, GSPO) uses ``r_t = p_t / q_t`` with ``p`` the
trainer's probability of the sampled token and ``q`` the sampler's. It is computed as
``exp(clamp(log p_t - log q_t, -20, 20))``: a token the sampler gave almost no probability (or a
logprob input that is wrong by a lot) gives a ratio of at most ``e^20 ~ 4.9e8`` instead of
``inf``/``nan``; outside that range the token's gradient through the ratio is zero. This is the
clamp verl applies before its ``exp`` (``compute_policy_loss``).

**Off-policy corrections** (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"; Liu et al. 2025, "When speed kills stability: demystifying RL collapse
from the training-inference mismatch"). The sampler is not the trainer: its kernels, precision
and (with ``max_staleness > 0``) its weights differ, so sampled tokens come from ``q`` while the
gradient is for ``p``. A correction multiplies each token's loss term by a detached factor
``k_t`` computed from the sampler->trainer ratio ``rho = sg[p / q]``:

- ``tis`` (truncated importance sampling): ``k = min(1, C / rho)``. The effective importance
  weight ``rho * k = min(rho, C)`` is capped at ``C`` (``cap``), so one token with a huge ratio
  cannot dominate the batch's gradient (IMPALA's truncated rho-bar, Espeholt et al. 2018).
- ``mis`` (masked importance sampling): ``k = 1[low <= rho <= high]``. Tokens (or sequences)
  whose ratio leaves the band are dropped from the gradient altogether.

``level`` chooses what ``rho`` is: ``token`` (each token's own ratio), ``sequence`` (the product
over the sequence's weighted tokens, ``exp(sum_t log rho_t)``, the exact sequence importance
weight) or ``geometric`` (its geometric mean, ``exp(mean_t log rho_t)``, which does not explode
with length); at the two sequence levels every token of a sequence gets the same factor.

Metrics: ``<loss>/tis_truncated_frac:mean`` or ``<loss>/mis_masked_frac:mean`` — the fraction of
weighted tokens whose factor is below 1 (truncated) or 0 (masked).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from rlkit.errors import InvalidInputError

#: log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp
LOG_RATIO_CLAMP = 20.0

KINDS = ("tis", "mis")
LEVELS = ("token", "sequence", "geometric")


def clamped_log_ratio(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor) -> torch.Tensor:
    """``clamp(log p - log q, -20, 20)``."""
    return torch.clamp(logprobs - sampler_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def importance_ratio(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor) -> torch.Tensor:
    """``r = exp(clamp(log p - log q, -20, 20))`` (differentiable in ``logprobs``)."""
    return torch.exp(clamped_log_ratio(logprobs, sampler_logprobs))


@dataclass(frozen=True)
class OffPolicyCorrection:
    """``kind`` tis/mis at ``level`` token/sequence/geometric; ``cap`` = C (tis), ``[low, high]`` the
    band (mis)."""

    kind: str
    level: str = "token"
    cap: float = 2.0
    low: float = 0.5
    high: float = 2.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidInputError(f"correction.kind={self.kind!r} must be one of {list(KINDS)}")
        if self.level not in LEVELS:
            raise InvalidInputError(f"correction.level={self.level!r} must be one of {list(LEVELS)}")
        if not (self.cap > 0 and self.cap < float("inf")):
            raise InvalidInputError(f"correction.cap={self.cap} must be a positive number (e.g. 2.0)")
        if not (0.0 <= self.low <= 1.0 <= self.high < float("inf")):
            raise InvalidInputError(f"correction: the band [low={self.low}, high={self.high}] must contain 1 (e.g. [0.5, 2.0])")

    @classmethod
    def coerce(cls, spec: Any) -> Optional["OffPolicyCorrection"]:
        """``None``, an instance, or a mapping ``{kind, level, cap, low, high}`` (from a config)."""
        if spec is None or isinstance(spec, cls):
            return spec
        if isinstance(spec, str):
            return cls(kind=spec)
        if not isinstance(spec, Mapping):
            raise InvalidInputError(f"correction={spec!r} must be a mapping like {{kind: tis, cap: 2.0}}")
        unknown = sorted(set(spec) - {"kind", "level", "cap", "low", "high"})
        if unknown:
            raise InvalidInputError(f"correction: unknown key {unknown[0]!r} (accepts kind, level, cap, low, high)")
        if "kind" not in spec:
            raise InvalidInputError("correction: 'kind' is required (tis or mis)")
        # kind/level are strings, cap/low/high numbers: one kwargs dict of both (checked in __post_init__)
        values: Dict[str, Any] = {k: (str(v) if k in ("kind", "level") else float(v)) for k, v in spec.items()}
        return cls(**values)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def factors(
        self, log_rho: Sequence[torch.Tensor], weights: Sequence[torch.Tensor]
    ) -> Tuple[List[torch.Tensor], float]:
        """Per-datum detached factors ``k`` (``[T_i]`` each) from per-datum ``log rho`` (already
        detached and clamped) and weights; and the fraction of weighted tokens with ``k < 1``."""
        out: List[torch.Tensor] = []
        affected, counted = 0.0, 0.0
        for lr, w in zip(log_rho, weights):
            mask = w != 0
            if self.level == "token":
                level_log = lr
            else:
                n = mask.sum().clamp(min=1)
                total = (lr * mask).sum()
                seq = total if self.level == "sequence" else total / n
                level_log = torch.clamp(seq, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).expand_as(lr)
            rho = torch.exp(level_log)
            if self.kind == "tis":
                k = torch.clamp(self.cap / rho, max=1.0)
            else:
                k = ((rho >= self.low) & (rho <= self.high)).to(lr.dtype)
            out.append(k.detach())
            affected += float((k[mask] < 1.0).sum())
            counted += float(mask.sum())
        return out, (affected / counted if counted else 0.0)

    def metric_name(self, loss_name: str) -> str:
        return f"{loss_name}/tis_truncated_frac:mean" if self.kind == "tis" else f"{loss_name}/mis_masked_frac:mean"


def correction_factors(
    correction: Optional[OffPolicyCorrection],
    loss_name: str,
    logprobs: Sequence[torch.Tensor],
    sampler_logprobs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
) -> Tuple[Optional[List[torch.Tensor]], Dict[str, float]]:
    """The factors of ``correction`` (``None`` when there is none) and their metric."""
    if correction is None:
        return None, {}
    log_rho = [clamped_log_ratio(lp.detach(), q) for lp, q in zip(logprobs, sampler_logprobs)]
    factors, frac = correction.factors(log_rho, weights)
    return factors, {correction.metric_name(loss_name): frac}
