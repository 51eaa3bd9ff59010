"""Group-relative advantage estimators: plain functions of a group's rewards ``r_1..r_G``.

- ``grpo``:    ``A_i = (r_i - mean(r)) / (std(r) + eps)``, std with Bessel's correction as in
  verl/TRL (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300);
- ``dr_grpo``: ``A_i = r_i - mean(r)`` — no std division, which biases toward easy/hard questions
  (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783);
- ``rloo``:    ``A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean(r))`` — leave-one-out
  baseline (Ahmadian et al. 2024, arXiv:2402.14740).

A group whose rewards are all equal has zero advantage everywhere (no gradient): the loop counts
those groups and can drop them.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence

from rlkit.errors import ConfigError


def grpo(rewards: Sequence[float], eps: float = 1e-6) -> List[float]:
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1)) if n > 1 else 0.0
    return [(r - mean) / (std + eps) for r in rewards]


def dr_grpo(rewards: Sequence[float]) -> List[float]:
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def rloo(rewards: Sequence[float]) -> List[float]:
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = sum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


ESTIMATORS: Dict[str, Callable[[Sequence[float]], List[float]]] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def compute_advantages(rewards: Sequence[float], estimator: str = "grpo") -> List[float]:
    if estimator not in ESTIMATORS:
        raise ConfigError(f"advantage estimator {estimator!r} must be one of {sorted(ESTIMATORS)}")
    if not rewards:
        return []
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    return ESTIMATORS[estimator](rewards)
