"""A sweep's results in one place: ``report.md``, ``report.csv`` and ``report.png`` in its directory.

Written at the end of every ``rlkit train -m`` and by ``rlkit sweep report DIR`` for any sweep
directory, finished or not (a killed sweep, one still running, one with failed jobs). Each job is
a subdirectory holding a run (``config.yaml``) or at least a ``result.json``. For each job:

- its overrides (``result.json``, else ``overrides.yaml``), and the **swept parameters**: the keys
  whose values differ between jobs;
- its status: ``completed``, ``diverged``, ``failed`` (with the error line; a job refused before
  its run started is listed from ``refused_jobs.jsonl``), ``running`` (no result yet, its lock
  held by a live process) or ``killed`` (no result, and the process that held its lock is gone);
- its steps so far and final metrics (the last value of each key in ``metrics.jsonl``);
- its objective (:mod:`rlkit.sweep.objective`): for a job that did not finish, the value so far,
  shown with the step that logged it (``0.41 (step 0, unfinished)``: often the evaluation before
  any training, which must not read as the job's result).

The best job is the completed one with the best objective. The plot has one panel per swept
parameter, the objective against the parameter's value (log axis for positive numbers spanning
more than 20x, categories in order of appearance), the best job starred, jobs that did not
finish hollow.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from rlkit.errors import ConfigError
from rlkit.logging import save_figure
from rlkit.sweep.objective import (
    Objective,
    alive,
    as_float,
    last_values,
    objective_of,
    outcome,
    read_result,
    run_holder,
)

MARKDOWN, CSV, PLOT = "report.md", "report.csv", "report.png"
FINISHED = ("completed", "diverged", "failed")  # statuses with a recorded end


@dataclass
class JobRow:
    job: str
    dir: Path
    status: str
    overrides: Dict[str, str]
    steps: Optional[int]
    metrics: Dict[str, Any]
    objective: Optional[float]
    error: Optional[str] = None
    objective_step: Optional[int] = None  # the step whose line logged it (shown for a job that did not finish)


@dataclass
class Report:
    sweep_dir: Path
    objective: Optional[Objective]
    jobs: List[JobRow]
    params: List[str]
    best: Optional[JobRow] = None
    files: Dict[str, Path] = field(default_factory=dict)

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for j in self.jobs:
            out[j.status] = out.get(j.status, 0) + 1
        return out

    @property
    def failed(self) -> List[JobRow]:
        return [j for j in self.jobs if j.status == "failed"]


def _split(override: str) -> tuple:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _number(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _job_dirs(sweep_dir: Path) -> List[Path]:
    dirs = [
        d
        for d in sweep_dir.iterdir()
        if d.is_dir() and ((d / "config.yaml").is_file() or (d / "result.json").is_file())
    ]

    def order(d: Path) -> tuple:
        result = read_result(d) or {}
        num = result.get("job")
        if num is None and d.name.isdigit():
            num = int(d.name)
        return (num is None, num if num is not None else 0, d.name)

    return sorted(dirs, key=order)


def _read_job(d: Path) -> tuple:
    import yaml

    from rlkit.logging import read_jsonl
    from rlkit.runs import METRICS, OVERRIDES

    result = read_result(d) or {}
    config = yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").is_file() else {}
    overrides = result.get("overrides")
    if overrides is None and (d / OVERRIDES).is_file():
        overrides = yaml.safe_load((d / OVERRIDES).read_text()) or []
    records = read_jsonl(d / METRICS)
    final = last_values(records)
    final.pop("step", None)
    objective = (
        Objective(result["objective_key"], result["direction"])
        if result.get("objective_key")
        else objective_of(config or {})
    )
    status = result.get("status")
    if status is None:  # no end recorded: running, killed, or ended outside `rlkit train` (lock released)
        holder = run_holder(d)
        status = "ended" if holder is None else "running" if alive(holder["pid"], holder["host"]) else "killed"
    value = as_float(result.get("objective")) if status in FINISHED else None
    if value is None and objective is not None and status != "failed":
        value = outcome(objective, final).get("objective")  # so far
    logged_at = [int(r["step"]) for r in records if objective is not None and objective.key in r and "step" in r]
    row = JobRow(
        objective_step=logged_at[-1] if logged_at else None,
        job=str(result.get("job") if result.get("job") is not None else d.name),
        dir=d,
        status=status,
        overrides=dict(_split(o) for o in overrides or []),
        steps=max((int(r["step"]) for r in records if "step" in r), default=None),
        metrics=final,
        objective=value,
        error=result.get("error") or result.get("note"),  # a completed job's note: why it has no objective
    )
    return row, objective


def build_report(sweep_dir: Path) -> Report:
    sweep_dir = Path(sweep_dir).expanduser().resolve()
    if not sweep_dir.is_dir():
        raise ConfigError(f"sweep report: {sweep_dir} is not a directory")
    from rlkit.sweep.job import refused_jobs

    rows, objectives = [], []
    for d in _job_dirs(sweep_dir):
        row, objective = _read_job(d)
        rows.append(row)
        objectives.append(objective)
    seen = {r.job for r in rows}
    for entry in refused_jobs(sweep_dir):  # failed before their run directory was written
        job = str(entry.get("job"))
        if job in seen:
            continue
        seen.add(job)
        rows.append(
            JobRow(
                job,
                Path(entry.get("dir") or sweep_dir / job),
                "failed",
                dict(_split(o) for o in entry.get("overrides") or []),
                None,
                {},
                None,
                entry.get("error"),
            )
        )
        if entry.get("objective_key"):
            objectives.append(Objective(entry["objective_key"], entry["direction"]))
    rows.sort(key=lambda r: (not r.job.isdigit(), int(r.job) if r.job.isdigit() else 0, r.job))
    if not rows:
        raise ConfigError(
            f"sweep report: {sweep_dir} holds no jobs (no subdirectory with a config.yaml or result.json)"
        )
    objective = next((o for o in objectives if o is not None), None)
    keys: List[str] = []
    for row in rows:
        keys += [k for k in row.overrides if k not in keys]
    params = [k for k in keys if k not in ("run_dir", "resume") and len({row.overrides.get(k) for row in rows}) > 1]
    report = Report(sweep_dir, objective, rows, params)
    finished = [r for r in rows if r.status == "completed" and r.objective is not None and math.isfinite(r.objective)]
    if objective is not None and finished:
        best = finished[0]
        for r in finished[1:]:
            if objective.better(r.objective, best.objective):
                best = r
        report.best = best
    return report


# -- rendering -------------------------------------------------------------------------------------------


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _fmt_param(value: str) -> str:
    """A swept value as the table shows it: sampled floats to 4 significant digits (the CSV keeps
    every digit)."""
    number = _number(value)
    if number is not None and any(c in value for c in ".eE") and len(value) > 8:
        return f"{number:.4g}"
    return value


def metric_columns(report: Report, limit: Optional[int] = 4) -> List[str]:
    """Final metrics shown beside the objective: held-out ones (``eval/*``) first."""
    seen: List[str] = []
    for row in report.jobs:
        seen += [k for k in row.metrics if k not in seen]
    skip = {report.objective.key} if report.objective else set()
    numeric = [k for k in seen if k not in skip and any(_number(r.metrics.get(k)) is not None for r in report.jobs)]
    evals = [k for k in numeric if k.startswith("eval/")]
    rest = [k for k in numeric if not k.startswith("eval/")]
    if limit is None:
        return evals + rest
    counts = ("/tokens", "/problems", "/pairs", "/samples", "/examples")  # sizes, not results
    return [k for k in evals if not k.endswith(counts)][:limit]


def best_line(report: Report) -> str:
    if report.best is None:
        return "best: none (no job completed with a finite objective)"
    b = report.best
    params = ", ".join(f"{k}={_fmt_param(b.overrides.get(k, ''))}" for k in report.params) or "the only configuration"
    assert report.objective is not None
    return f"best: job {b.job} ({params}): {report.objective.key} {_fmt(b.objective)}, in {shown(b.dir)}"


def to_markdown(report: Report) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in report.counts().items())
    objective = f"{report.objective}" if report.objective else "none (set sweep.objective=METRIC)"
    lines = [
        f"# Sweep {report.sweep_dir.name}",
        "",
        f"`{shown(report.sweep_dir)}`: {len(report.jobs)} jobs ({counts}); objective {objective}",
        "",
        best_line(report),
        "",
    ]
    extra = metric_columns(report)
    head = ["job", "status", *report.params]
    if report.objective:
        head.append(report.objective.key)
    head += ["steps", *extra]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for row in report.jobs:
        cells = [
            row.job + (" **best**" if row is report.best else ""),
            row.status,
            *(_fmt_param(row.overrides.get(k, "")) for k in report.params),
        ]
        if report.objective:
            unfinished = row.status not in FINISHED and row.objective is not None and row.objective_step is not None
            cells.append(_fmt(row.objective) + (f" (step {row.objective_step}, unfinished)" if unfinished else ""))
        cells += [_fmt(row.steps), *(_fmt(row.metrics.get(k)) for k in extra)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    errors = [f"- job {r.job} {r.status}: {r.error}" for r in report.jobs if r.error]
    if errors:
        lines += ["", *errors]
    if "png" in report.files:
        lines += ["", f"![objective against each swept parameter]({PLOT})"]
    return "\n".join(lines) + "\n"


def to_csv(report: Report) -> str:
    out = io.StringIO()
    metrics = metric_columns(report, limit=None)
    head = ["job", "status", *report.params, "objective", "steps", *metrics, "error", "dir"]
    writer = csv.writer(out)
    writer.writerow(head)
    for row in report.jobs:
        writer.writerow(
            [
                row.job,
                row.status,
                *(row.overrides.get(k, "") for k in report.params),
                "" if row.objective is None else repr(row.objective),
                "" if row.steps is None else row.steps,
                *("" if row.metrics.get(k) is None else row.metrics.get(k) for k in metrics),
                row.error or "",
                str(row.dir),
            ]
        )
    return out.getvalue()


def plot(report: Report, path: Path) -> Optional[Path]:
    """One panel per swept parameter: objective against its value (see the module docstring)."""
    if report.objective is None:
        return None
    points = [r for r in report.jobs if r.objective is not None and math.isfinite(r.objective)]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = report.params or ["job"]
    cols = min(3, len(params))
    rows = (len(params) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.3 * rows), squeeze=False)
    for ax, param in zip(axes.flat, params, strict=False):
        raw = [r.job if param == "job" else r.overrides.get(param, "") for r in points]
        numbers = [_number(v) for v in raw]
        if all(n is not None for n in numbers):
            xs: List[float] = [float(n) for n in numbers]  # type: ignore[arg-type]
            if min(xs) > 0 and max(xs) / min(xs) > 20:
                ax.set_xscale("log")
        else:
            labels = list(dict.fromkeys(str(v) for v in raw))
            xs = [float(labels.index(str(v))) for v in raw]
            ax.set_xticks(range(len(labels)), labels, rotation=30 if max(len(s) for s in labels) > 8 else 0)
        for x, r in zip(xs, points, strict=True):
            done = r.status == "completed"
            ax.scatter(
                [x],
                [r.objective],
                s=140 if r is report.best else 36,
                marker="*" if r is report.best else "o",
                facecolors=("C3" if r is report.best else "C0") if done else "none",
                edgecolors="C3" if r is report.best else "C0",
                zorder=3,
            )
        ax.set_xlabel(param)
        ax.set_ylabel(report.objective.key)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(params) :]:
        ax.axis("off")
    fig.suptitle(f"{report.sweep_dir.name}: {report.objective}")
    fig.tight_layout()
    return save_figure(fig, path)


def write_report(sweep_dir: Path) -> Report:
    """Build the report of ``sweep_dir`` and write ``report.md``, ``report.csv``, ``report.png``."""
    from rlkit.files import atomic_write

    report = build_report(sweep_dir)
    png = report.sweep_dir / PLOT
    try:
        if plot(report, png):
            report.files["png"] = png
    except Exception as exc:  # noqa: BLE001 - a plot must never fail a finished sweep
        import logging

        logging.getLogger("rlkit.sweep").warning("note: could not plot the sweep: %s", exc)
    atomic_write(report.sweep_dir / CSV, to_csv(report))
    atomic_write(report.sweep_dir / MARKDOWN, to_markdown(report))
    report.files.update({"md": report.sweep_dir / MARKDOWN, "csv": report.sweep_dir / CSV})
    return report


def summary(report: Report) -> str:
    """What the console shows at the end of a sweep: the table and where the files are."""
    text = to_markdown(report).split("\n", 2)[2]  # without the title
    text = text.replace(f"\n![objective against each swept parameter]({PLOT})\n", "\n")
    files = ", ".join(shown(p) for k, p in report.files.items() if k in ("md", "csv", "png"))
    return text.rstrip("\n") + f"\n\nreport: {files}\n"
