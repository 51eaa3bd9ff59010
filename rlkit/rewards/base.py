"""The reward protocol: a plain callable ``(completion, problem) -> float | RewardResult``.

A reward takes the model's completion text and the problem record (a mapping with at least the
fields the reward reads, e.g. ``answer``) and returns a float, or a :class:`RewardResult` when it
has metrics to report. :func:`as_result` normalises either form; :class:`WeightedSum` composes
rewards as ``r = sum_i w_i * r_i`` and namespaces each part's metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, Union


@dataclass
class RewardResult:
    """A reward value plus metrics (averaged over rollouts by the loop) and free-form details."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


RewardFn = Callable[[str, Mapping[str, Any]], Union[float, RewardResult]]


def as_result(value: Union[float, int, bool, RewardResult]) -> RewardResult:
    """Normalise a reward function's return value to a :class:`RewardResult`."""
    if isinstance(value, RewardResult):
        return value
    return RewardResult(reward=float(value))


def reward_name(fn: Any) -> str:
    """A short name for metrics: ``fn.name``, else the class or function name in snake case."""
    name = getattr(fn, "name", None)
    if isinstance(name, str) and name:
        return name
    raw = getattr(fn, "__name__", None) or type(fn).__name__
    out = []
    for i, ch in enumerate(raw):
        if ch.isupper() and i and not raw[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


class WeightedSum:
    """``r = sum_i w_i * r_i`` over component rewards; metrics keep each part under its name.

    Args:
        parts: ``(weight, reward_fn)`` pairs.
    """

    name = "weighted_sum"

    def __init__(self, parts: Sequence[tuple[float, RewardFn]]):
        if not parts:
            raise ValueError("WeightedSum needs at least one (weight, reward) part")
        self.parts = [(float(w), fn) for w, fn in parts]

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        total = 0.0
        metrics: dict[str, float] = {}
        info: dict[str, Any] = {}
        for weight, fn in self.parts:
            part = as_result(fn(completion, problem))
            name = reward_name(fn)
            total += weight * part.reward
            metrics[f"{name}/reward"] = part.reward
            for key, value in part.metrics.items():
                metrics[f"{name}/{key}"] = value
            if part.info:
                info[name] = part.info
        if not math.isfinite(total):
            metrics["nonfinite"] = 1.0
        return RewardResult(reward=total, metrics=metrics, info=info)
