"""Summary statistics for reports over seeds: mean, sample standard deviation, and the 95%
confidence interval of the mean with Student's t (``mean +- t_{0.975, n-1} * s / sqrt(n)``)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional, Sequence

# two-sided 95% Student-t critical values t_{0.975, df}, df = 1..30
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t_critical_95(df: int) -> float:
    """t_{0.975, df}; 1.96 (the normal value) beyond df = 30 is within 2%."""
    if df < 1:
        raise ValueError("a confidence interval needs at least 2 values")
    return _T975[df - 1] if df <= 30 else 1.96 + 2.4 / df


@dataclass
class Summary:
    n: int
    mean: float
    std: Optional[float]
    ci95_low: Optional[float]
    ci95_high: Optional[float]

    def as_dict(self) -> Dict[str, Optional[float]]:
        return asdict(self)

    def __str__(self) -> str:
        if self.ci95_low is None:
            return f"{self.mean:.3f} (n={self.n})"
        return f"{self.mean:.3f} [{self.ci95_low:.3f}, {self.ci95_high:.3f}]"


def summarize(values: Sequence[float]) -> Summary:
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("no values to summarize")
    mean = sum(values) / n
    if n == 1:
        return Summary(1, mean, None, None, None)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_critical_95(n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half)
