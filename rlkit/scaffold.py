"""The one loop scaffold: what every loop does around its algorithm.

::

    with LoopSession(run) as s:                 # takes the run directory (lock, config), seeds the RNGs, opens the service
        teacher = open_teacher(s.service)       # optional: anything that must fail before the trainer
        trainer = s.open_trainer()              # fresh LoRA, train.init_checkpoint's weights, or resumed
        s.restore(data=batcher)                 # resumed: loop state (state_dict objects) and RNG
        s.defer(task.close)                     # cleanup, run on every exit path
        for step in s.begin(t, total):          # length and cadence (t.eval_every, t.checkpoint_every); the console
            metrics = evaluate(step) if s.eval_due(step) else {}
            ...                                 # the algorithm: sample, score, forward_backward, optim_step
            s.end_step(step, metrics, s.checkpoint(step + 1, data=batcher))  # the line, then the checkpoint if due
        return s.finish(lambda: evaluate(total))  # the final evaluation, metrics.png, result.json

**The cadence is the scaffold's**, one rule for every loop: an evaluation is due before the first
step (``done == 0``), every ``eval_every`` completed steps and after the last (:meth:`eval_due`); a
checkpoint every ``checkpoint_every`` completed steps and after the last (:meth:`checkpoint`;
``LoopConfig.due``). :meth:`finish` runs the final evaluation, logs it at ``step = total`` (when it
has anything to say), plots ``metrics.png``, and records in ``result.json`` that the run finished
(``status: completed``) whether or not the recipe evaluates at all.

**The RNG state is the scaffold's, explicitly**: entering seeds the global Python, NumPy and torch
RNGs from ``cfg.seed`` (:func:`rlkit.rng.seed_everything`); :meth:`loop_state` captures them into a
checkpoint and :meth:`restore` puts a resumed run's back. :class:`rlkit.runs.Run` touches none.

On exit — normal, an exception, Ctrl-C — the deferred callbacks run in reverse order, then the
training client is stopped and the service closed. When the block raised, a failing cleanup is
logged and the block's own error is the one that propagates (the first error is the one
reported); otherwise the first cleanup error is raised.

Nothing is written to the run directory before :class:`LoopSession` is entered: a loop loads and
checks its data, task and loss first, so a refused run leaves no files behind
(:meth:`rlkit.runs.Run.materialize`).

**The step's end is the scaffold's**: :meth:`LoopSession.end_step` writes the step's metrics line
and only then records its checkpoint (queued earlier with :meth:`LoopSession.checkpoint`, so the
save overlaps the step's bookkeeping). A run killed between the two resumes from the previous
checkpoint and recomputes the step: no line is lost and none is written twice.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence

from rlkit.config import LoopConfig
from rlkit.errors import ConfigError, RlkitError
from rlkit.rng import capture_rng, restore_rng, seed_everything
from rlkit.runs import PendingCheckpoint, Run, write_result

log = logging.getLogger("rlkit.runs")


class LoopSession:
    """Service, training client, resumed state and cleanup of one loop run (see the module docstring)."""

    def __init__(self, run: Run):
        self.run = run
        self.record: Optional[Dict[str, Any]] = run.checkpoint_record()
        self.service: Any = None
        self.trainer: Any = None
        self._cleanups: List[Callable[[], Any]] = []
        self.total: Optional[int] = None  # set by begin()
        self._eval_every = 0
        self._checkpoint_every = 0

    # -- opening ---------------------------------------------------------------------------------
    def __enter__(self) -> "LoopSession":
        self.run.materialize()
        seed_everything(int(self.run.config.get("seed") or 0))  # a resumed run's restore() then puts its checkpoint's back
        self.service = connect_backend(self.run.cfg.backend, self.run.dir)
        return self

    def open_trainer(self) -> Any:
        """The loop's training client: restored with its optimizer from the checkpoint being
        resumed; else ``train.init_checkpoint``'s weights with a fresh optimizer; else a new LoRA
        adapter from ``cfg.model``. Stopped when the session exits."""
        if self.trainer is None:
            self.trainer = open_training_client(self.run.cfg, self.service, self.record)
        return self.trainer

    # -- the cadence -----------------------------------------------------------------------------
    def begin(self, config: LoopConfig, total: int, *, title: Optional[str] = None) -> range:
        """Declare the run's length (``total`` optimizer steps) and cadence (``config.eval_every``,
        ``config.checkpoint_every``), open the console/wandb sinks, and return the steps still to
        run: ``range(start_step, total)``."""
        self.total = int(total)
        self._eval_every, self._checkpoint_every = int(config.eval_every), int(config.checkpoint_every)
        self.run.start(self.total, title=title)
        return range(self.start_step, self.total)

    def _require_begun(self, what: str) -> int:
        if self.total is None:
            raise RuntimeError(f"LoopSession.{what}: call begin(config, total) first (the run's length and cadence)")
        return self.total

    def eval_due(self, done: int) -> bool:
        """Whether an evaluation is due after ``done`` completed steps: before the first step, every
        ``eval_every`` steps, and after the last."""
        total = self._require_begun("eval_due")
        return done == 0 or LoopConfig.due(self._eval_every, done, total)

    def checkpoint_due(self, done: int) -> bool:
        """Whether a checkpoint is due after ``done`` completed steps: every ``checkpoint_every``
        steps and after the last."""
        return LoopConfig.due(self._checkpoint_every, done, self._require_begun("checkpoint_due"))

    def checkpoint(self, done: int, state: Optional[Dict[str, Any]] = None, **stateful: Any) -> Optional[PendingCheckpoint]:
        """When :meth:`checkpoint_due`, queue the checkpoint after ``done`` completed steps with
        ``state`` (a :meth:`loop_state` taken earlier) or ``loop_state(**stateful)`` taken now;
        else ``None``. Hand the result to :meth:`end_step`, which records it after the step's line."""
        if not self.checkpoint_due(done):
            return None
        return self.queue_checkpoint(done, state if state is not None else self.loop_state(**stateful))

    def finish(self, final: Optional[Callable[[], Dict[str, Any]]] = None, *, plot_keys: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """The end of the run: ``final()`` (the final evaluation) logged at ``step = total`` when it
        returns anything, ``metrics.png`` (``plot_keys``, else the main metrics), and
        ``result.json`` saying the run finished (``status: completed``, evaluated or not). Returns
        the last value of every metric."""
        total = self._require_begun("finish")
        metrics = final() if final is not None else {}
        if metrics:
            self.run.log(total, metrics)
        last = self.run.finish(plot_keys=plot_keys)
        write_result(self.run.dir, status="completed", steps=total, error=None)
        return last

    # -- the end of a step -----------------------------------------------------------------------
    def queue_checkpoint(self, step: int, loop_state: Dict[str, Any]) -> PendingCheckpoint:
        """Queue ``save_state`` for the state after ``step`` completed steps (recorded by
        :meth:`end_step`), due or not: :meth:`checkpoint` applies the cadence."""
        return self.run.save_checkpoint(step, self.open_trainer(), loop_state, wait=False)

    def end_step(self, step: int, metrics: Dict[str, Any], checkpoint: Optional[PendingCheckpoint] = None) -> None:
        """Log step ``step``'s line, then (if one was queued) record its checkpoint: never the other
        way round, so a run killed in between loses no line (see the module docstring)."""
        self.run.log(step, metrics)
        if checkpoint is not None:
            checkpoint.commit()

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


def connect_backend(backend: Any, run_dir: Any) -> Any:
    """The session service of a run's ``backend`` config: ``rlkit.connect(name, **options)``; a
    backend option ``checkpoint_dir`` left null becomes ``<run_dir>/checkpoints``. While runs share
    this process (:func:`rlkit.thread_runs.shared_runs`), the shared local service's view for this run."""
    from pathlib import Path

    from omegaconf import OmegaConf

    import rlkit
    from rlkit import thread_runs

    options = OmegaConf.to_container(backend, resolve=True, enum_to_str=True) if OmegaConf.is_config(backend) else dict(backend)
    name = options.pop("name")
    if "checkpoint_dir" in options and not options["checkpoint_dir"]:
        options["checkpoint_dir"] = str(Path(run_dir) / "checkpoints")
    if isinstance(options.get("vllm"), dict) and not options["vllm"].get("log_dir"):
        options["vllm"]["log_dir"] = str(run_dir)  # backend.vllm.launch=true: the server's log in the run directory
    from rlkit.backends.local.distributed import RANK_OPTIONS

    for key in RANK_OPTIONS:  # how the processes running this loop are launched and joined, not session options
        options.pop(key, None)
    options = {k: v for k, v in options.items() if v is not None}
    shared = thread_runs.active()  # runs on threads of one process share one local engine (rlkit.thread_runs)
    return shared.connect(name, options) if shared is not None else rlkit.connect(name, **options)


def open_training_client(cfg: Any, service: Any, record: Optional[Dict[str, Any]] = None) -> Any:
    """The loop's training client: given a checkpoint record (a resumed run), restored from it with
    its optimizer state; else, with ``train.init_checkpoint``, that checkpoint's weights and a fresh
    optimizer; else a new LoRA adapter from ``cfg.model``."""
    if record:
        return service.create_training_client_from_state_with_optimizer(record["checkpoint"])
    init = cfg.train.get("init_checkpoint") if "train" in cfg else None
    if init:
        try:
            return service.create_training_client_from_state(init)
        except RlkitError as exc:
            raise ConfigError(f"train.init_checkpoint={init!r}: {exc}") from None
    m = cfg.model
    if m.get("lora") is False:  # full-parameter fine-tuning (refused in one line where the engine cannot)
        return service.create_full_training_client(m.base_model, seed=int(cfg.seed if m.seed is None else m.seed))
    return service.create_lora_training_client(
        m.base_model,
        rank=int(m.rank),
        alpha=int(m.alpha),
        seed=int(cfg.seed if m.seed is None else m.seed),
        train_attn=bool(m.train_attn),
        train_mlp=bool(m.train_mlp),
    )
