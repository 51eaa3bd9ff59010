"""A format reward: does the completion have the shape we asked for?

``r = (match_reward if re.search(pattern, completion) else miss_reward)
      - length_penalty * [max_chars is not None and len(completion) > max_chars]``
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Pattern, Union

from rlkit.errors import InvalidInputError
from rlkit.rewards.base import RewardResult

#: A line ``#### <number>`` (optionally ``$``-prefixed, with thousands separators, signed,
#: decimal) or a non-empty ``\boxed{...}`` anywhere in the completion.
DEFAULT_PATTERN = (
    r"(?m)^[ \t]*####[ \t]*\$?[ \t]*[-+\u2212]?\$?[ \t]*(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
    r"|\\boxed\s*\{\s*[^\s}]"
)


class FormatReward:
    """Rewards a completion for matching ``pattern`` (searched anywhere, ``re.search``).

    Args:
        pattern: a regex string or compiled pattern; default :data:`DEFAULT_PATTERN` (a final
            ``#### <number>`` line or a ``\\boxed{}`` answer). Put flags inline, e.g. ``(?s)``.
        match_reward: reward when the pattern is found.
        miss_reward: reward when it is not.
        max_chars: when set, completions longer than this lose ``length_penalty``; off by default.
        length_penalty: subtracted from the reward of a too-long completion.

    Metrics: ``format_ok`` (0/1 pattern found) and ``too_long`` (0/1; always 0 when ``max_chars``
    is None).
    """

    name = "format"

    def __init__(
        self,
        pattern: Union[str, Pattern[str]] = DEFAULT_PATTERN,
        match_reward: float = 1.0,
        miss_reward: float = 0.0,
        max_chars: int | None = None,
        length_penalty: float = 1.0,
    ):
        try:
            self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        except re.error as exc:
            raise InvalidInputError(f"FormatReward: invalid regex {pattern!r}: {exc}") from None
        if not hasattr(self.pattern, "search"):
            kind = type(pattern).__name__
            raise InvalidInputError(f"FormatReward: pattern must be a str or regex, got {kind}")
        if max_chars is not None and max_chars < 0:
            raise InvalidInputError(f"FormatReward: max_chars must be >= 0, got {max_chars}")
        self.match_reward = float(match_reward)
        self.miss_reward = float(miss_reward)
        self.max_chars = max_chars
        self.length_penalty = float(length_penalty)

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        ok = bool(self.pattern.search(completion or ""))
        too_long = self.max_chars is not None and len(completion or "") > self.max_chars
        reward = (self.match_reward if ok else self.miss_reward) - (
            self.length_penalty if too_long else 0.0
        )
        return RewardResult(
            reward=reward, metrics={"format_ok": float(ok), "too_long": float(too_long)}
        )
