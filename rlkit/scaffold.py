"""The one loop scaffold: what every loop does around its algorithm.

::

    with LoopSession(run) as s:                 # opens the run directory (lock, config) and the service
        teacher = open_teacher(s.service)       # optional: anything that must fail before the trainer
        trainer = s.open_trainer()              # fresh LoRA, train.init_checkpoint's weights, or resumed
        s.restore(data=batcher)                 # resumed: loop state (state_dict objects) and RNG
        s.defer(task.close)                     # cleanup, run on every exit path
        for step in range(s.start_step, total): ...

On exit — normal, an exception, Ctrl-C — the deferred callbacks run in reverse order, then the
training client is stopped and the service closed. When the block raised, a failing cleanup is
logged and the block's own error is the one that propagates (the first error is the one
reported); otherwise the first cleanup error is raised.

Nothing is written to the run directory before :class:`LoopSession` is entered: a loop loads and
checks its data, task and loss first, so a refused run leaves no files behind
(:meth:`rlkit.runs.Run.materialize`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

from rlkit.runs import Run, capture_rng, restore_rng

log = logging.getLogger("rlkit.runs")


class LoopSession:
    """Service, training client, resumed state and cleanup of one loop run (see the module docstring)."""

    def __init__(self, run: Run):
        self.run = run
        self.record: Optional[Dict[str, Any]] = run.resume()
        self.service: Any = None
        self.trainer: Any = None
        self._cleanups: List[Callable[[], Any]] = []

    # -- opening ---------------------------------------------------------------------------------
    def __enter__(self) -> "LoopSession":
        self.run.materialize()
        self.service = self.run.connect()
        return self

    def open_trainer(self) -> Any:
        """The loop's training client: restored with its optimizer from the checkpoint being
        resumed; else ``train.init_checkpoint``'s weights with a fresh optimizer; else a new LoRA
        adapter from ``cfg.model``. Stopped when the session exits."""
        if self.trainer is None:
            self.trainer = self.run.training_client(self.service, self.record)
        return self.trainer

    # -- state -----------------------------------------------------------------------------------
    @property
    def start_step(self) -> int:
        """Completed optimizer steps at the start (0 on a fresh run)."""
        return int(self.record["step"]) if self.record else 0

    @property
    def resumed(self) -> bool:
        return self.record is not None

    def restore(self, **stateful: Any) -> None:
        """On a resumed run, ``obj.load_state_dict(loop_state[name])`` for each ``name=obj`` and
        the global RNG state; nothing on a fresh run."""
        if self.record is None:
            return
        state = self.record["loop_state"]
        for name, obj in stateful.items():
            obj.load_state_dict(state[name])
        restore_rng(state["rng"])

    @staticmethod
    def loop_state(**stateful: Any) -> Dict[str, Any]:
        """``{name: obj.state_dict(), ..., "rng": ...}``: what :meth:`restore` reads back."""
        state: Dict[str, Any] = {name: obj.state_dict() for name, obj in stateful.items()}
        state["rng"] = capture_rng()
        return state

    # -- cleanup ---------------------------------------------------------------------------------
    def defer(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Run ``fn()`` when the session exits (before the trainer stops and the service closes)."""
        self._cleanups.append(fn)
        return fn

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        steps: List[Callable[[], Any]] = list(reversed(self._cleanups))
        if self.trainer is not None:
            steps.append(self.trainer.stop)
        if self.service is not None:
            steps.append(self.service.close)
        first: Optional[BaseException] = None
        for step in steps:
            try:
                step()
            except BaseException as cleanup_error:  # noqa: BLE001 - every cleanup runs
                if exc is not None or first is not None:
                    log.warning("while stopping after an error: %s: %s", type(cleanup_error).__name__, cleanup_error)
                else:
                    first = cleanup_error
        self.run.close()
        if first is not None:
            raise first

