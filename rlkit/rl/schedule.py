"""Where rollout batches come from: synchronously, or from a producer thread running ahead.

Both schedules hand the loop a :class:`Batch` per step: the scored groups, the sampler version
(number of optimizer steps behind the weights that sampled it), and the curriculum/RNG state right
after it was drawn (saved with checkpoints so a resumed run continues the same data order).

- :class:`SyncSchedule` (``max_staleness = 0``): sample with the newest weights, then train. On a
  deterministic backend a run is exactly reproducible.
- :class:`AsyncSchedule` (``max_staleness = k >= 1``): a producer thread samples the next batches
  while the trainer works, with whichever weights are newest when a batch starts. ``pace`` never
  starts batch *b* before step *b - k* has finished, so no batch is more than *k* steps stale;
  ``drop`` lets the producer run ahead (at most k + 1 batches queued) and the loop discards
  batches staler than *k*. Staleness is reported per step.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from rlkit.rl.env import TrajectoryGroup


@dataclass
class Batch:
    groups: List[TrajectoryGroup]
    version: int
    state: Dict[str, Any] = field(default_factory=dict)
    stats: Dict[str, float] = field(default_factory=dict)


class SyncSchedule:
    """``next(step)`` samples step ``step``'s batch now, with the current sampler."""

    def __init__(self, sample_batch: Callable[[int, Any, int], Batch]):
        self.sample_batch = sample_batch
        self.sampler: Any = None
        self.version = 0

    def publish(self, sampler: Any, version: int) -> None:
        self.sampler, self.version = sampler, version

    def next(self, step: int) -> Batch:
        return self.sample_batch(step, self.sampler, self.version)

    def close(self) -> None:
        pass


class AsyncSchedule:
    """A producer thread sampling batches ahead of training (see module docstring)."""

    def __init__(self, sample_batch: Callable[[int, Any, int], Batch], max_staleness: int, policy: str, start_step: int):
        if policy not in ("pace", "drop"):
            raise ValueError(f"staleness_policy={policy!r} must be 'pace' or 'drop'")
        self.sample_batch = sample_batch
        self.k, self.policy = max_staleness, policy
        self._cond = threading.Condition()
        self._sampler: Any = None
        self._version = start_step
        self._trained = start_step  # optimizer steps finished
        self._next_batch = start_step
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=max_staleness + 1)
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.dropped = 0

    @property
    def sampler(self) -> Any:
        """The newest published sampling client."""
        return self._sampler

    def publish(self, sampler: Any, version: int) -> None:
        with self._cond:
            self._sampler, self._version, self._trained = sampler, version, version
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="rlkit-rollout-producer", daemon=True)
            self._thread.start()

    def _produce(self) -> None:
        while True:
            with self._cond:
                if self.policy == "pace":
                    self._cond.wait_for(lambda: self._stop or self._next_batch - self._trained <= self.k)
                if self._stop:
                    return
                b, sampler, version = self._next_batch, self._sampler, self._version
                self._next_batch += 1
            try:
                item: Any = self.sample_batch(b, sampler, version)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the loop's thread
                item = exc
            while not self._stop:
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def next(self, step: int) -> Batch:
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            staleness = step - item.version
            if self.policy == "drop" and staleness > self.k:
                self.dropped += 1
                continue
            return item

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
