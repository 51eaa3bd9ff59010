"""One job of ``rlkit train``, as Hydra's task function runs it (in the launcher's process: the
main one, a joblib worker, a submitit job).

It checks the job's config (a sampling sweeper's trial is composed by Hydra, not by rlkit's
pre-flight), runs the loop, records ``result.json`` in the run directory and returns the objective
to the sweeper (:mod:`rlkit.sweep.objective`). Inside a sweep, a job that fails does not stop the
sweep: it says why in one line on stderr, records it, and returns the failed value. A job refused
before its run directory was written (a bad trial) leaves its run directory unwritten, as every
refused run does; its line goes to the sweep directory's ``refused_jobs.jsonl`` for the report. A
single run's error ends the command (one line, exit code 2; a bug's traceback, exit code 1), and a
single run that had started records ``result.json`` with ``status: failed`` and the one-line reason
first, whatever the error.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from rlkit.errors import RlkitError
from rlkit.sweep.objective import last_values, objective_of, outcome, read_result, write_result
from rlkit.sweep.objective import told as told_value

log = logging.getLogger("rlkit.sweep")

REFUSED = "refused_jobs.jsonl"  # in the sweep directory: jobs that failed before their run started


def one_line(exc: BaseException) -> str:
    from omegaconf.errors import OmegaConfBaseException

    from rlkit.config import describe_config_error

    if isinstance(exc, OmegaConfBaseException):
        return describe_config_error(exc)
    text = " ".join(str(exc).split())
    return text if isinstance(exc, RlkitError) else f"{type(exc).__name__}: {text}"


def run_job(
    cfg: Any, run_dir: Path, overrides: Sequence[str], *, job: Optional[int], sweep_dir: Optional[Path] = None
) -> Optional[float]:
    """Validate, execute and record one job; return the number the sweeper is told. ``sweep_dir``
    is set for a job of a sweep (whose failure must not stop the others)."""
    from omegaconf.errors import OmegaConfBaseException

    from rlkit.composition import execute, validate
    from rlkit.logging import read_jsonl
    from rlkit.runs import METRICS

    in_sweep = sweep_dir is not None
    run_dir = Path(run_dir).resolve()
    objective = objective_of(cfg)
    opened: List[Any] = []  # the Run, once open: whether it materialised says if the directory is ours
    if job is None:  # a sweep's job resumed on its own keeps its number
        job = (read_result(run_dir) or {}).get("job")
    started = time.time()
    try:
        validate(cfg)
        execute(cfg, run_dir, overrides, on_open=opened.append)
        record: Dict[str, Any] = outcome(objective, last_values(read_jsonl(run_dir / METRICS)), finished=True)
    except (RlkitError, OmegaConfBaseException) as exc:
        record = {"status": "failed", "objective": None, "error": one_line(exc)}
        if not in_sweep:
            _record(run_dir, record, objective, overrides, job, started, cfg, opened, None)
            raise
    except Exception as exc:  # noqa: BLE001 - in a sweep a bug in one job must not take the others down
        record = {"status": "failed", "objective": None, "error": one_line(exc), "traceback": traceback.format_exc()}
        if not in_sweep:  # a run that started says in result.json that it failed, and why, before the traceback
            _record(run_dir, record, objective, overrides, job, started, cfg, opened, None)
            raise
    return _record(run_dir, record, objective, overrides, job, started, cfg, opened, sweep_dir)


def _record(
    run_dir: Path,
    record: Dict[str, Any],
    objective: Any,
    overrides: Sequence[str],
    job: Optional[int],
    started: float,
    cfg: Any,
    opened: List[Any],
    sweep_dir: Optional[Path],
) -> float:
    """Write the job's outcome where it is ours to write (see the module docstring), say why a
    job of a sweep failed, and return what the sweeper is told."""
    status = record["status"]
    told = told_value(cfg, objective, record)
    fields = {
        "job": job,
        "overrides": list(overrides),
        "objective_key": objective.key if objective else None,
        "direction": objective.direction if objective else None,
        "status": status,
        "objective": record["objective"],
        "told": told,
        "error": record.get("error"),
        "note": record.get("note"),
        "traceback": record.get("traceback"),
        "started": started,
    }
    if opened and opened[0].materialized:
        write_result(run_dir, **fields)
    elif sweep_dir is not None:
        _append_refused(Path(sweep_dir), {**fields, "dir": str(run_dir), "time": time.time()})
    if sweep_dir is not None and (status != "completed" or record.get("note")):
        what = f"job {job}" if job is not None else "job"
        towards = f" (the worst for {objective})" if objective and abs(told) == float("inf") else ""
        log.warning("rlkit: %s %s: %s; the sweeper is told %s%s", what, status, record.get("error") or record.get("note"), told, towards)
    return told


def _append_refused(sweep_dir: Path, record: Dict[str, Any]) -> None:
    """One line, appended with a single write (jobs of a parallel launcher may append at once)."""
    from rlkit.sweep.objective import _jsonable

    sweep_dir.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(_jsonable(record)) + "\n").encode("utf-8")
    fd = os.open(sweep_dir / REFUSED, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def refused_jobs(sweep_dir: Path) -> List[Dict[str, Any]]:
    from rlkit.logging import read_jsonl

    return read_jsonl(Path(sweep_dir) / REFUSED)
