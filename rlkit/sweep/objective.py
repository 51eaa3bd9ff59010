"""The one number a sweep job returns to Hydra's sweeper, and the job's ``result.json``.

``sweep.objective`` is a metric key of ``metrics.jsonl``; the job's objective is the key's last
logged value (for the built-in loops, the final held-out evaluation). Left null it is the loop's
main held-out metric, declared on its :class:`~rlkit.loops.LoopSpec` (``eval/nll`` for SFT,
``eval/greedy_accuracy`` for RL and task SFT, ``eval/loss`` for DPO, ``eval/reverse_kl`` for
distillation). ``sweep.direction`` (minimize | maximize) defaults to the loop's own for its
objective; for another key it follows the key's name: one that reads as a success rate
(:data:`MAXIMIZED`) is maximised, anything else (a loss, an NLL, a KL) minimised.

A job that fails (an error, or an objective it never logged) or diverges (a NaN or infinite
objective) returns ``sweep.failed_value``, by default the worst value for the direction: ``+inf``
when minimising, ``-inf`` when maximising. Optuna records that as a complete trial worse than every
other (it refuses NaN: its Hydra sweeper then crashes), Nevergrad and Ax take it as a bad point,
and the basic sweeper ignores return values. The job says so in one line on stderr.

Every job (sweep or not) leaves ``result.json`` in its run directory when it ends: ``completed`` /
``diverged`` / ``failed``, with the objective, what the sweeper was told, the error line and the
overrides. A run directory without one is running (its ``.lock`` names a live process) or was
killed (the process named there is gone). ``rlkit sweep report`` reads both.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from rlkit.runs import RESULT, read_result, write_result  # noqa: F401 - result.json is a run record
from rlkit.runs import _finite_json as _jsonable  # noqa: F401 - sweep.job's refused lines

#: substrings of a metric key that mean "higher is better"
MAXIMIZED = ("accuracy", "reward", "pass@", "win_rate", "score", "success")


@dataclass(frozen=True)
class Objective:
    key: str
    direction: str  # "minimize" | "maximize"

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def worst(self) -> float:
        return -math.inf if self.maximize else math.inf

    def better(self, a: float, b: float) -> bool:
        """Whether objective value ``a`` beats ``b``."""
        return a > b if self.maximize else a < b

    def __str__(self) -> str:
        return f"{self.key} ({self.direction})"


def _get(node: Any, key: str) -> Any:
    if node is None:
        return None
    value = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
    return getattr(value, "value", value)  # an Enum member -> its value


def objective_of(config: Mapping[str, Any]) -> Optional[Objective]:
    """The objective a config asks for (``sweep.*`` or the loop's default); ``None`` when neither
    the config nor its loop names one."""
    from rlkit.loops import LOOPS

    sweep = _get(config, "sweep")
    spec = LOOPS.get(str(_get(config, "loop")))
    key = _get(sweep, "objective") or (spec.objective if spec else None)
    if not key:
        return None
    direction = _get(sweep, "direction")
    if not direction:
        if spec is not None and key == spec.objective:
            direction = spec.direction
        else:
            direction = "maximize" if any(word in key for word in MAXIMIZED) else "minimize"
    return Objective(str(key), str(direction))


def told(config: Mapping[str, Any], objective: Optional[Objective], record: Mapping[str, Any]) -> Optional[float]:
    """What the sweeper is told for a job's :func:`outcome` ``record``: its objective when it
    completed with one (``None`` when the config has no objective), else the failed value."""
    if record["status"] == "completed" and (objective is None or record["objective"] is not None):
        return record["objective"]
    return failed_value(config, objective)


def failed_value(config: Mapping[str, Any], objective: Optional[Objective]) -> float:
    explicit = _get(_get(config, "sweep"), "failed_value")
    if explicit is not None:
        return float(explicit)
    return objective.worst() if objective else math.inf


def last_values(records: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The last logged value of every metric (``run.finish()``'s answer, from ``metrics.jsonl``)."""
    last: Dict[str, Any] = {}
    for record in records:
        last.update(record)
    return last


def outcome(objective: Optional[Objective], final: Mapping[str, Any], *, finished: bool = False) -> Dict[str, Any]:
    """``{"status", "objective", "error"}`` of a job with metrics ``final``. An objective never
    logged fails the job, unless the run ``finished`` (its loop returned: e.g. a recipe with
    evaluation off): then it is ``completed`` with no objective, the reason under ``"note"``, and
    the sweeper is told the failed value (:func:`told`)."""
    if objective is None:
        return {"status": "completed", "objective": None, "error": None}
    value = final.get(objective.key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        logged = ", ".join(sorted(k for k in final if k != "step")) or "nothing"
        why = f"objective {objective.key!r} was never logged (logged: {logged}); set sweep.objective=KEY"
        if finished:
            return {"status": "completed", "objective": None, "error": None, "note": why}
        return {"status": "failed", "objective": None, "error": why}
    value = float(value)
    if not math.isfinite(value) or abs(value) >= 1e308:  # metrics.jsonl stores +-inf as +-1e308
        return {"status": "diverged", "objective": value, "error": f"{objective.key} = {value}"}
    return {"status": "completed", "objective": value, "error": None}


def run_holder(run_dir: Path) -> Optional[Dict[str, Any]]:
    """Who holds (or last held, if it died) the run directory's lock: ``{"pid", "host"}`` from the
    ``.lock`` file :class:`rlkit.runs.RunLock` writes (emptied when a run ends normally)."""
    import re

    from rlkit.runs import LOCK

    try:
        text = (Path(run_dir) / LOCK).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    match = re.match(r"pid (\d+) on (\S+?),", text)
    return {"pid": int(match.group(1)), "host": match.group(2)} if match else None


def alive(pid: int, host: str) -> bool:
    """Whether process ``pid`` on ``host`` is alive (not a zombie); another host's is assumed so."""
    if host != socket.gethostname():
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        if Path("/proc/self/stat").exists():
            return False  # /proc works and the process is gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return state not in ("Z", "X")


def as_float(value: Any) -> Optional[float]:
    """A ``result.json`` number back (``"inf"`` strings included)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
