"""Where a run's numbers go: metric sinks (``run.log(step, metrics)``) and plots.

- :class:`JsonlSink` — ``metrics.jsonl``, always: one JSON object per call (``{"step": s, ...}``),
  written with a single ``write`` and flushed, so a killed run leaves at most a torn last line
  (which :func:`read_jsonl` skips).
- :class:`ConsoleSink` — a live ``rich`` progress bar (step/total, elapsed, ETA, key metrics) when
  stdout is a terminal; otherwise a compact line every ``log_every`` steps (for logs and CI).
- :class:`WandbSink` — Weights & Biases (``logger=wandb``); ``WANDB_MODE=offline`` or
  ``logger.mode=offline`` works with no network. The wandb run id is kept in the run directory
  so a resumed run continues the same wandb run; the jobs of one sweep share a group
  (``logger.group``, set to the sweep directory by ``rlkit train -m``).

A sink is any object with ``log(step, metrics)`` and ``close()``; :func:`make_sinks` builds the
configured ones. Sinks never raise into the loop for a metric they cannot show.

Plots: :func:`plot_metrics` draws a run's ``metrics.png`` (by default the :data:`MAIN_METRICS` it
logged, the same keys the console shows) and :func:`save_figure` writes any figure atomically
(``rlkit.sweep.report``'s ``report.png`` too), so a reader never sees half a PNG.
"""

from __future__ import annotations

import json
import logging as _logging
import math
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence

from rlkit.errors import ConfigError

Metrics = Mapping[str, Any]

#: a run's main metrics, in this order: shown on the console and plotted by default (those logged)
MAIN_METRICS = (
    "train/nll",
    "train/loss",
    "eval/nll",
    "eval/accuracy",
    "reward/mean",
    "train/lr",
    "train/grad_norm",
    "time/tokens_per_s",
)
_SHORT = {"train/nll": "nll", "train/loss": "loss", "train/lr": "lr", "train/grad_norm": "gnorm", "time/tokens_per_s": "tok/s"}


class Sink(Protocol):
    def log(self, step: int, metrics: Metrics) -> None: ...

    def close(self) -> None: ...


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    if hasattr(value, "item") and callable(value.item):
        return _jsonable(value.item())
    return value


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """Every complete JSON line of ``path`` (a torn last line from a killed writer is skipped)."""
    out: List[Dict[str, Any]] = []
    if not path.exists():
        return out
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break  # torn write
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


class JsonlSink:
    """Appends ``{"step": step, **metrics}`` lines to ``path``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: Metrics) -> None:
        record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def format_metrics(metrics: Metrics, keys: Sequence[str] = MAIN_METRICS) -> str:
    parts = []
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and value is not None:
            name = _SHORT.get(key, key)
            parts.append(f"{name} {value:.3g}" if abs(value) < 1e4 else f"{name} {value:.0f}")
    return "  ".join(parts)


class ConsoleSink:
    """Progress on the console (see the module docstring)."""

    def __init__(self, total: int, start: int = 0, *, log_every: int = 1, live: Optional[bool] = None, title: str = "train"):
        self.total, self.start, self.log_every, self.title = total, start, max(1, log_every), title
        self.live = sys.stdout.isatty() if live is None else live
        self._last: Dict[str, Any] = {}
        self._t0 = time.time()
        self._progress = None
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[metrics]}"),
                refresh_per_second=4,
            )
            self._task = self._progress.add_task(title, total=total, completed=start, metrics="")
            self._progress.start()

    def log(self, step: int, metrics: Metrics) -> None:
        self._last.update({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        done = min(step + 1, self.total)
        if self._progress is not None:
            self._progress.update(self._task, completed=done, metrics=format_metrics(self._last))
            return
        if step % self.log_every == 0 or done >= self.total or any(k.startswith("eval/") for k in metrics):
            elapsed = time.time() - self._t0
            rate = (done - self.start) / elapsed if elapsed > 0 and done > self.start else 0.0
            eta = (self.total - done) / rate if rate else float("nan")
            eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if math.isfinite(eta) else "--:--:--"
            where = f"step {step} ({done}/{self.total})" if step < self.total else f"end ({self.total}/{self.total})"
            print(f"{self.title} {where}  {format_metrics(metrics)}  eta {eta_text}", flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class WandbSink:
    """Weights & Biases (optional dependency: ``pip install 'rlkit[wandb]'``)."""

    def __init__(self, logger_cfg: Any, run_dir: Path, config: Dict[str, Any]):
        try:
            import wandb
        except ImportError:
            raise ConfigError("logger=wandb needs the wandb package: pip install 'rlkit[wandb]'") from None
        self._wandb = wandb
        id_file = run_dir / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        if not id_file.exists():
            id_file.write_text(run_id + "\n")
        mode = getattr(logger_cfg, "mode", None)
        mode = getattr(mode, "value", mode) or os.environ.get("WANDB_MODE") or None
        try:
            self._run = self._init(wandb, logger_cfg, run_dir, run_id, mode, config)
        except Exception as exc:  # noqa: BLE001 - no network, bad credentials, ...
            reason = " ".join(str(exc).split())[:300]
            raise ConfigError(f"logger=wandb: wandb.init failed ({reason}); WANDB_MODE=offline logs without a network") from None

    @staticmethod
    def _init(wandb: Any, logger_cfg: Any, run_dir: Path, run_id: str, mode: Any, config: Dict[str, Any]) -> Any:
        return wandb.init(
            project=logger_cfg.project,
            entity=logger_cfg.entity,
            name=logger_cfg.name or run_dir.name,
            group=getattr(logger_cfg, "group", None),
            tags=list(logger_cfg.tags or []),
            dir=str(run_dir),
            id=run_id,
            resume="allow",
            mode=mode,
            config=config,
            reinit="finish_previous",
        )

    def log(self, step: int, metrics: Metrics) -> None:
        self._run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=int(step))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def make_sinks(logger_cfg: Any, run_dir: Path, config: Dict[str, Any], *, total: int, start: int) -> List[Sink]:
    """The console and wandb sinks ``logger_cfg`` asks for (``metrics.jsonl`` is the run's own)."""
    sinks: List[Sink] = []
    if logger_cfg is None:
        return sinks
    if getattr(logger_cfg, "console", True):
        sinks.append(ConsoleSink(total, start, log_every=getattr(logger_cfg, "log_every", 1)))
    if getattr(logger_cfg, "wandb", False):
        sinks.append(WandbSink(logger_cfg, run_dir, config))
    return sinks


class _CurrentStderrHandler(_logging.StreamHandler):
    """A stream handler bound to whatever ``sys.stderr`` is when a record is written, not when the
    handler was made (tests, notebooks and tools swap ``sys.stderr``; a handler holding the old,
    closed stream prints "--- Logging error ---" instead of the note)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property wins
        pass


def setup_console_logging(level: int = _logging.INFO) -> None:
    """Notes from rlkit (``rlkit.*`` loggers) as plain lines on stderr."""
    logger = _logging.getLogger("rlkit")
    if not any(getattr(h, "_rlkit", False) for h in logger.handlers):
        handler = _CurrentStderrHandler()
        handler.setFormatter(_logging.Formatter("%(message)s"))
        handler._rlkit = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


#: environment defaults that keep libraries quiet in this process and the ones it starts
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",  # transformers' notes
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' and huggingface_hub's tqdm bars (loading, converting, writing)
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}


def quiet_libraries(verbose: bool = False) -> None:
    """Keep a run's console to rlkit's own progress: transformers' and datasets' progress bars
    ("Loading weights", "Converting and de-quantizing GGUF tensors", ...) and notes, and
    matplotlib's ("generated new fontManager"), unless ``verbose``. Environment defaults cover
    libraries imported later and worker processes; ones already imported are told directly.
    rlkit's own notes (``rlkit.*`` loggers, e.g. the one-time model conversion) still show."""
    if verbose:
        _logging.getLogger().setLevel(_logging.INFO)  # configs/hydra/hydra_logging/rlkit.yaml starts it at WARNING
        os.environ["RLKIT_VERBOSE"] = "1"  # rlkit.backends.local.models.quiet_loading leaves the bars on
        return
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # libraries' deprecation notes are not the user's
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for name in ("matplotlib", "PIL", "urllib3", "httpx", "filelock", "datasets"):
        _logging.getLogger(name).setLevel(_logging.WARNING)
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "datasets" in sys.modules:
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()


def iter_numeric(records: Iterable[Mapping[str, Any]], key: str):
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            yield r["step"], v


# -- plots -------------------------------------------------------------------------------------------


def save_figure(fig: Any, path: Path, *, dpi: int = 100) -> Path:
    """Write a matplotlib figure to ``path`` atomically (:func:`rlkit.files.atomic_file`), then close it."""
    import matplotlib.pyplot as plt

    from rlkit.files import atomic_file

    try:
        with atomic_file(Path(path)) as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    return Path(path)


_PLOT_LOCK = threading.Lock()  # pyplot's figures are process-global: runs on threads plot one at a time


def plot_metrics(records: Sequence[Mapping[str, Any]], path: Path, *, keys: Optional[Sequence[str]] = None, title: str = "") -> Optional[Path]:
    """A grid of line plots (one per metric, by step) written atomically to ``path``: ``keys``
    (those logged), else the :data:`MAIN_METRICS` logged, else a loop's first six metrics. One
    plot at a time in a process (runs on threads of one process: :mod:`rlkit.thread_runs`)."""
    with _PLOT_LOCK:
        return _plot_metrics(records, path, keys=keys, title=title)


def _plot_metrics(records: Sequence[Mapping[str, Any]], path: Path, *, keys: Optional[Sequence[str]], title: str) -> Optional[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    candidates = list(keys) if keys else list(MAIN_METRICS)
    series = {k: list(iter_numeric(records, k)) for k in candidates}
    series = {k: v for k, v in series.items() if v}
    if not series and not keys:  # a loop with other metric names: its first few
        seen: List[str] = []
        for r in records:
            seen += [k for k in r if k not in seen and k != "step" and not k.startswith("time/")]
        series = {k: v for k in seen[:6] if (v := list(iter_numeric(records, k)))}
    if not series:
        return None
    n = len(series)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (key, points) in zip(axes.flat, series.items()):
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.1, top=0.88 if title else 0.94, wspace=0.3, hspace=0.5)
    return save_figure(fig, path)
