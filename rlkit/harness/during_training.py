"""lm-evaluation-harness during training: ``train.eval.harness: {tasks: [...], limit: N, every: K}``.

The RL loop evaluates the weights of step 0 (before training), every ``every`` steps and the final
weights with the harness — the same tasks, prompts and scoring as ``rlkit eval`` (rlkit's copies of
GSM8K and MBPP offline, code in rlkit's sandbox), on the run's own engine through the sampling
client the loop already publishes (:class:`rlkit.harness.model.RlkitLM` ``client=``), so nothing is
exported and no second model is loaded.

**Overlapped.** An evaluation runs on a background thread while training goes on (``overlap``,
the default): the sampling client it holds is that step's weights, and the engine interleaves its
requests with the run's own (the local engine batches them together). Its numbers join the
metrics line of the step that is ending when they are ready, with ``harness/step`` naming the
weights they measured; at most one evaluation is in flight (a due one waits for the previous one).
The final evaluation runs when training ends and is logged with the final held-out evaluation.
``overlap: false`` runs each one in place.

**Metrics**: ``harness/<task>/<metric>`` and ``harness/<task>/<metric>_stderr`` (lm-eval's standard
error), e.g. ``harness/gsm8k/exact_match/strict-match``; lm-eval's filter name becomes the last part.
Bad input (an unknown task, data unreachable offline, code tasks without a sandbox) is one
ConfigError line when the loop starts, before any model loads (:func:`HarnessEval.prepare`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from rlkit.errors import BackendUnavailableError, ConfigError

log = logging.getLogger("rlkit.harness")


@dataclass
class HarnessEvalConfig:
    """``train.eval.harness``: off while ``tasks`` is empty."""

    tasks: List[str] = field(default_factory=list)
    limit: Optional[float] = None  # items per task (a fraction below 1: that share)
    every: int = 0  # steps between evaluations (0: before training and at the end only)
    num_fewshot: Optional[int] = None
    apply_chat_template: bool = False
    overlap: bool = True  # evaluate on a background thread while training goes on
    max_gen_toks: int = 256

    def check(self) -> None:
        if self.every < 0:
            raise ConfigError(f"train.eval.harness.every={self.every} must be >= 0 (0: before training and at the end)")
        if self.limit is not None and self.limit <= 0:
            raise ConfigError(f"train.eval.harness.limit={self.limit} must be a positive number")


def check_task_names(names: List[str]) -> None:
    """lm-eval's catalog knows every one of ``names`` (one ConfigError line, with the nearest
    names, for one it does not; lm-evaluation-harness missing is one line too)."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise BackendUnavailableError("train.eval.harness needs lm-evaluation-harness: pip install 'rlkit[eval]'") from None
    from rlkit.harness import catalog as catalog_mod
    from rlkit.harness import tasks as tasks_mod

    tasks_mod.select(catalog_mod.load_catalog(None), names, local_data=True)


def metrics_of(results: Dict[str, Any]) -> Dict[str, float]:
    """lm-eval's ``results`` as flat metrics: ``harness/<task>/<metric>[/<filter>][_stderr]``."""
    out: Dict[str, float] = {}
    for task, values in (results.get("results") or {}).items():
        for key, value in values.items():
            if key == "alias" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            metric, _, filter_name = key.partition(",")
            stderr = metric.endswith("_stderr")
            base = metric[: -len("_stderr")] if stderr else metric
            name = f"harness/{task}/{base}" + (f"/{filter_name}" if filter_name and filter_name != "none" else "")
            if math.isfinite(float(value)):
                out[name + ("_stderr" if stderr else "")] = float(value)
    return out


class HarnessEval:
    """The harness evaluations of one run (see the module docstring)."""

    def __init__(self, config: HarnessEvalConfig, total: int):
        self.config, self.total = config, int(total)
        self.built: List[Any] = []
        self.chosen: Any = None
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlkit-harness")
        self.pending: Optional[concurrent.futures.Future] = None

    @property
    def enabled(self) -> bool:
        return bool(self.config.tasks)

    def prepare(self) -> "HarnessEval":
        """Resolve the tasks and their data (lm-eval's task configs over rlkit's local copies),
        before any model loads: one ConfigError line for an unknown task or unreachable data."""
        if not self.enabled:
            return self
        self.config.check()
        check_task_names(list(self.config.tasks))
        from rlkit.harness import catalog as catalog_mod
        from rlkit.harness import tasks as tasks_mod

        catalog = catalog_mod.load_catalog(None)
        self.chosen = tasks_mod.select(catalog, list(self.config.tasks), local_data=True)
        online = bool(self.chosen.hub) and tasks_mod.hub_reachable()
        if not online:
            tasks_mod.go_offline()
        self.built = tasks_mod.build(catalog, self.chosen, online=online)
        return self

    def due(self, done: int) -> bool:
        """Before training (``done == 0``) and every ``every`` steps; the end is :meth:`final`'s, and
        one due as the last step begins is left to it (so each metrics line holds one evaluation's
        numbers: a background one lands in a later line, the last in the last step's)."""
        if not self.enabled or done >= self.total:
            return False
        return done == 0 or (self.config.every > 0 and done % self.config.every == 0 and done < self.total - 1)

    def evaluate(self, sampling_client: Any, done: int) -> Dict[str, float]:
        """The harness on ``sampling_client`` (the weights after ``done`` steps), now."""
        import lm_eval
        from lm_eval.tasks import TaskManager

        from rlkit.harness.model import RlkitLM

        lm = RlkitLM(client=sampling_client, max_gen_toks=self.config.max_gen_toks)
        results = lm_eval.simple_evaluate(
            model=lm, tasks=self.built, num_fewshot=self.config.num_fewshot, limit=self.config.limit,
            apply_chat_template=self.config.apply_chat_template, fewshot_as_multiturn=self.config.apply_chat_template,
            confirm_run_unsafe_code=bool(self.chosen.sandboxed), task_manager=TaskManager(include_defaults=False),
            log_samples=False, bootstrap_iters=1000)
        metrics = metrics_of(results or {})
        metrics["harness/step"] = float(done)
        return metrics

    def at_step(self, sampling_client: Any, done: int) -> Dict[str, float]:
        """Called as step ``done`` begins, with the sampling client of the weights after ``done``
        steps: the numbers of a background evaluation that has finished (to log in this step's line),
        and, when :meth:`due`, this step's evaluation started (or, without ``overlap``, run in place)."""
        out = self.ready()
        if self.due(done):
            if not self.config.overlap:
                out.update(self.evaluate(sampling_client, done))
            else:
                out.update(self.wait())  # at most one in flight
                self.pending = self.pool.submit(self.evaluate, sampling_client, done)
        return out

    def ready(self) -> Dict[str, float]:
        """The numbers of a finished background evaluation (empty while it runs, or when none)."""
        if self.pending is None or not self.pending.done():
            return {}
        return self.wait()

    def wait(self) -> Dict[str, float]:
        """The numbers of the background evaluation in flight, once it finishes (empty when none)."""
        if self.pending is None:
            return {}
        future, self.pending = self.pending, None
        return future.result()

    def final(self, sampling_client: Any) -> Dict[str, float]:
        """The end of training: the last weights, evaluated in place (call :meth:`wait` for the
        background one first and log it with the last step)."""
        return self.evaluate(sampling_client, self.total) if self.enabled else {}

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
