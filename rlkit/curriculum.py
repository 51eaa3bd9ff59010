"""Curricula: which problems go into the next batch.

Every sampler has ``next_batch(n) -> list of problem indices``, ``update(index, rewards)`` (called
with each scored group) and ``state_dict()`` / ``load_state_dict()`` so a resumed run continues the
same data order.

- :class:`FixedOrder` — problems in dataset order, cycling.
- :class:`ShuffledEpochs` — a fresh seeded permutation every epoch.
- :class:`PassRateAdaptive` — samples problem *i* with probability proportional to
  ``p_i (1 - p_i) + floor``, where ``p_i`` is a smoothed pass rate (Beta(1,1) prior, exponential
  moving average over observed groups): problems always or never solved, whose GRPO groups carry
  no gradient, are sampled less.
- :class:`DynamicSampling` — DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476), an
  admission gate on top of any of these: groups whose rewards are all equal are discarded and more
  problems are drawn until the batch is full or the resampling budget is spent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

from rlkit.errors import ConfigError


class Curriculum:
    def __init__(self, num_problems: int, seed: int = 0):
        if num_problems <= 0:
            raise ConfigError("the curriculum has no problems (empty training set)")
        self.num_problems = num_problems
        self.seed = seed

    def next_batch(self, n: int) -> List[int]:
        raise NotImplementedError

    def update(self, index: int, rewards: Sequence[float]) -> None:
        """Observe a scored group of problem ``index`` (most curricula ignore it)."""

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        pass


class FixedOrder(Curriculum):
    def __init__(self, num_problems: int, seed: int = 0):
        super().__init__(num_problems, seed)
        self.position = 0

    def next_batch(self, n: int) -> List[int]:
        out = [(self.position + k) % self.num_problems for k in range(n)]
        self.position = (self.position + n) % self.num_problems
        return out

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = int(state["position"])


class ShuffledEpochs(Curriculum):
    def __init__(self, num_problems: int, seed: int = 0):
        super().__init__(num_problems, seed)
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> List[int]:
        order = list(range(self.num_problems))
        random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> List[int]:
        out = []
        for _ in range(n):
            if self.position >= self.num_problems:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state):
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


class PassRateAdaptive(Curriculum):
    """Weight ``p(1-p) + floor`` with ``p`` an EMA of each problem's pass rate (prior 0.5)."""

    def __init__(self, num_problems: int, seed: int = 0, floor: float = 0.02, ema: float = 0.5, success_threshold: float = 0.5):
        super().__init__(num_problems, seed)
        if not 0 < ema <= 1 or floor < 0:
            raise ConfigError(f"pass_rate_adaptive: ema={ema} must be in (0, 1] and floor={floor} >= 0")
        self.floor, self.ema, self.success_threshold = floor, ema, success_threshold
        self.pass_rate = [0.5] * num_problems
        self.rng = random.Random(seed)

    def weight(self, index: int) -> float:
        p = self.pass_rate[index]
        return p * (1 - p) + self.floor

    def next_batch(self, n: int) -> List[int]:
        n_unique = min(n, self.num_problems)
        weights = [self.weight(i) for i in range(self.num_problems)]
        chosen: List[int] = []
        available = list(range(self.num_problems))
        for _ in range(n_unique):  # weighted sampling without replacement
            total = sum(weights[i] for i in available)
            pick = self.rng.random() * total
            acc = 0.0
            for j, i in enumerate(available):
                acc += weights[i]
                if acc >= pick:
                    chosen.append(available.pop(j))
                    break
            else:
                chosen.append(available.pop())
        return chosen + [self.rng.randrange(self.num_problems) for _ in range(n - n_unique)]

    def update(self, index: int, rewards: Sequence[float]) -> None:
        if not rewards:
            return
        rate = sum(1.0 for r in rewards if r >= self.success_threshold) / len(rewards)
        self.pass_rate[index] = (1 - self.ema) * self.pass_rate[index] + self.ema * rate

    def state_dict(self):
        return {"pass_rate": list(self.pass_rate), "rng": _encode_rng(self.rng.getstate())}

    def load_state_dict(self, state):
        self.pass_rate = [float(p) for p in state["pass_rate"]]
        self.rng.setstate(_decode_rng(state["rng"]))


@dataclass
class DynamicSampling:
    """Fill a batch of ``want`` groups with groups that have reward variance (DAPO's dynamic
    sampling). ``draw(n)`` rolls out ``n`` new problems' groups; while ``enabled`` and under
    ``max_rounds`` extra rounds, groups with all-equal rewards are dropped and more are drawn; the
    last round's groups are kept whatever their variance (so a batch is never empty for lack of
    budget). Disabled, one draw of ``want`` groups is the batch."""

    enabled: bool = False
    max_rounds: int = 3

    def fill(self, want: int, draw: Callable[[int], List[Any]]) -> Tuple[List[Any], int, int]:
        """``(groups, problems drawn, filtering rounds)``."""
        groups: List[Any] = []
        drawn = rounds = 0
        while len(groups) < want:
            got = draw(want - len(groups))
            drawn += len(got)
            if self.enabled and rounds < self.max_rounds:
                groups += [g for g in got if g.has_variance]
                rounds += 1
            else:
                groups += got
                break
        return groups, drawn, rounds


def _encode_rng(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


CURRICULA = {"fixed": FixedOrder, "shuffled": ShuffledEpochs, "pass_rate_adaptive": PassRateAdaptive}


def build_curriculum(name: str, num_problems: int, seed: int = 0, **options: Any) -> Curriculum:
    if name not in CURRICULA:
        raise ConfigError(f"curriculum.name={name!r} must be one of {sorted(CURRICULA)}")
    try:
        return CURRICULA[name](num_problems, seed=seed, **options)
    except TypeError as exc:
        raise ConfigError(f"curriculum {name!r}: {exc}") from None
