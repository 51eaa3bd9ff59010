"""Run directories: what every loop writes, and how a killed run resumes with nothing lost.

A run directory holds::

    config.yaml         the resolved config (every default filled in)
    overrides.yaml      the command-line overrides it was started with
    metrics.jsonl       one JSON line per step ({"step": s, "train/nll": ..., ...}), flushed per line
    checkpoints.jsonl   one line per checkpoint: {"step", "checkpoint", "loop_state", "rng_file", "time"}
    rng/                step_XXXXXX.json: the RNG states of that checkpoint's loop_state (every "rng" key,
                        ~10 KB each, kept out of checkpoints.jsonl's lines; older runs hold them inline)
    checkpoints/        the local backend's checkpoint directories (adapter + optimizer)
    transcripts/        step_XXXXXX.jsonl: sampled completions, where the loop samples
    metrics.png         the main metrics, plotted when the run finishes
    result.json         how the run ended: written when it finishes (``status: completed``), and by
                        ``rlkit train`` when it fails (``status: failed`` and the one-line reason)

Step convention: ``metrics.jsonl`` line ``step = s`` describes optimizer step ``s`` (0-based) and
any evaluation made just before it; a checkpoint record ``step = k`` holds the state after ``k``
completed steps and is appended only after lines ``0..k-1`` were written. The final evaluation is
logged at ``step = total`` after the final checkpoint.

Resume (``Run.open`` on a directory that already holds a run, via ``resume=DIR`` or by rerunning
into the same ``run_dir``): the composed config must match ``config.yaml`` (``run_dir``,
``resume``, ``logger``, ``verbose``, ``sweep`` and ``backend.nproc`` may differ), ``metrics.jsonl`` is cut back — atomically — to the lines
before the last checkpoint, later transcripts are removed, and :meth:`Run.checkpoint_record` returns
that checkpoint's record. The loop's :class:`rlkit.scaffold.LoopSession` restores its trainer
(adapter + optimizer through ``create_training_client_from_state_with_optimizer``), and its data order and
RNG state from ``record["loop_state"]`` (:mod:`rlkit.rng`; the scaffold seeds the global RNGs from
``cfg.seed`` when it takes the directory). Since
every line after the checkpoint is recomputed from the same state, a run killed at any point and
resumed writes the same metrics and weights as one that never stopped (on a deterministic backend).

``checkpoints.jsonl`` and ``config.yaml`` are replaced atomically (write to a temporary file,
fsync, rename); checkpoint directories are atomic in the backend.

A :class:`Run` is the directory, its records and its lock, nothing else: connecting to the
backend, the training client, the RNG state, the eval/checkpoint cadence and the step's
log-then-checkpoint order are the scaffold's (:mod:`rlkit.scaffold`); the console, wandb and the
plot are :mod:`rlkit.logging`'s; atomic writes are :mod:`rlkit.files`'. Nothing is written before
:meth:`Run.materialize` (which ``LoopSession`` calls on entry; writing before it is a programming
error, said so), and nothing reaches the console before :meth:`Run.start` (``LoopSession.begin``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rlkit.errors import ConfigError
from rlkit.files import UMASK, atomic_write
from rlkit.logging import JsonlSink, Sink, make_sinks, plot_metrics, read_jsonl

log = logging.getLogger("rlkit.runs")

CONFIG = "config.yaml"
OVERRIDES = "overrides.yaml"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints.jsonl"
RNG_DIR = "rng"  # rng/step_XXXXXX.json: each checkpoint's RNG states, beside checkpoints.jsonl
TRANSCRIPTS = "transcripts"
PLOT = "metrics.png"
RESULT = "result.json"

#: config keys that may differ when a run is resumed
RESUMABLE_CHANGES = ("run_dir", "resume", "logger", "verbose", "sweep", "backend.nproc")  # nproc: resume on other ranks


# -- configs ----------------------------------------------------------------------------------------------


def _flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    if isinstance(node, Mapping):
        out: Dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def config_difference(saved: Mapping[str, Any], new: Mapping[str, Any], ignore: Sequence[str] = RESUMABLE_CHANGES) -> Optional[str]:
    """The first key whose value differs between two configs (``None`` if they agree)."""
    a, b = _flatten(saved), _flatten(new)
    for key in sorted(set(a) | set(b)):
        if any(key == p or key.startswith(p + ".") for p in ignore):
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            return f"{key}: {a.get(key, '<absent>')!r} in the run, {b.get(key, '<absent>')!r} now"
    return None


# -- RNG states kept beside checkpoints.jsonl ---------------------------------------------------------------


def split_rng(state: Mapping[str, Any], prefix: str = "") -> tuple:
    """``(state without its "rng" entries, {dotted path: rng value})``, at any depth of nested mappings."""
    kept: Dict[str, Any] = {}
    found: Dict[str, Any] = {}
    for key, value in state.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key == "rng":
            found[path] = value
        elif isinstance(value, Mapping):
            kept[key], inner = split_rng(value, path)
            found.update(inner)
        else:
            kept[key] = value
    return kept, found


def join_rng(state: Dict[str, Any], found: Mapping[str, Any]) -> Dict[str, Any]:
    """Undo :func:`split_rng` (a copy of ``state`` with each dotted path set again)."""
    out = json.loads(json.dumps(state))
    for path, value in found.items():
        node = out
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


# -- holding and locking a run directory -------------------------------------------------------------


def _holds_run(directory: Path, config: Mapping[str, Any]) -> bool:
    """Whether ``directory`` holds a run this config may continue; refuse one it may not."""
    import yaml

    if not directory.is_dir() or not any(p.name != LOCK for p in directory.iterdir()):
        return False
    if not (directory / CONFIG).is_file():
        raise ConfigError(f"run_dir {directory} already exists and is not an rlkit run (no {CONFIG}); choose another run_dir")
    saved = yaml.safe_load((directory / CONFIG).read_text()) or {}
    if saved.get("recipe") != config.get("recipe") or saved.get("loop") != config.get("loop"):
        raise ConfigError(
            f"run_dir {directory} holds a run of recipe {saved.get('recipe')!r}, not {config.get('recipe')!r}; "
            "choose another run_dir (or resume it with: rlkit train resume=" + str(directory) + ")"
        )
    diff = config_difference(saved, config)
    if diff:
        raise ConfigError(
            f"run_dir {directory} holds a run with a different config ({diff}); "
            f"choose another run_dir, or continue it unchanged with: rlkit train resume={directory}"
        )
    return True


LOCK = ".lock"


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/.lock``, held while a run writes its directory.

    The kernel drops the lock when its process dies, however it dies, so a dead run never blocks
    a resume; the file's content (pid, host, start time) names the holder in the refusal, and a
    non-empty file found unlocked means its run died without closing (said once). The file is
    emptied, not removed, on release (removing it would let two processes lock two inodes).
    """

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def acquire(cls, directory: Path) -> "RunLock":
        import fcntl
        import socket

        path = directory / LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~UMASK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"run_dir {directory} is in use by another rlkit run ({holder}); wait for it to finish or choose another run_dir") from None
        previous = os.read(fd, 4096).decode("utf-8", "replace").strip()
        if previous:
            log.warning("note: %s was locked by a run that is no longer alive (%s); taking it over", directory, previous)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        os.fsync(fd)
        return cls(path, fd)

    def release(self) -> None:
        import fcntl

        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = -1


# -- the run -------------------------------------------------------------------------------------------


class PendingCheckpoint:
    """A ``save_state`` that was queued; :meth:`commit` waits for it and records it."""

    def __init__(self, run: "Run", step: int, future: Any, loop_state: Dict[str, Any]):
        self.run, self.step, self.future, self.loop_state = run, step, future, loop_state

    def commit(self) -> Dict[str, Any]:
        response = self.future.result()
        checkpoint = getattr(response, "model_package_arn", None) or getattr(response, "path", None) or str(response)
        return self.run._append_checkpoint(self.step, checkpoint, self.loop_state)


class Run:
    """One run directory (see the module docstring). Create with :meth:`open`."""

    def __init__(self, cfg: Any, directory: Path, config: Dict[str, Any], resumed: bool):
        self.cfg = cfg
        self.dir = directory
        self.config = config
        self.resumed = resumed
        self._record: Optional[Dict[str, Any]] = None
        self._jsonl: Optional[JsonlSink] = None
        self._sinks: List[Sink] = []
        self._started = False
        self._closed = False
        self._materialized = False
        self._overrides: List[str] = []
        self._lock: Optional[RunLock] = None
        self.log_seconds = 0.0  # time spent in log() / checkpoint bookkeeping (for benchmarks)

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, cfg: Any, run_dir: str | os.PathLike, *, overrides: Sequence[str] = ()) -> "Run":
        """The run in ``run_dir``: a new one, or the run it holds (to resume). Only reads: nothing
        is written until :meth:`materialize` (called by the loop once its inputs are checked)."""
        from omegaconf import OmegaConf

        directory = Path(run_dir).expanduser().resolve()
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"run_dir {directory} is a file, not a directory; choose another run_dir")
        if OmegaConf.is_config(cfg):
            OmegaConf.set_readonly(cfg, False)
            cfg.run_dir = str(directory)
            config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        else:
            config = dict(cfg)
            config["run_dir"] = str(directory)
        resumed = _holds_run(directory, config)
        run = cls(cfg, directory, config, resumed)
        run._overrides = [str(o) for o in overrides]
        records = read_jsonl(directory / CHECKPOINTS) if resumed else []
        if resumed:  # the newest checkpoint that verifies; a corrupt newer one is said (one line) and skipped
            from rlkit.checkpoint_verify import restorable_records

            records = restorable_records(records, log.warning)
        run._record = records[-1] if records else None
        return run

    def materialize(self) -> None:
        """Take the run directory: lock it (a second run into it is refused; a dead run's lock is
        taken over), write ``config.yaml`` / ``overrides.yaml`` (a new run) or cut a resumed run
        back to its last checkpoint, and open ``metrics.jsonl``. Idempotent."""
        if self._materialized:
            return
        import yaml

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = RunLock.acquire(self.dir)
            self.resumed = _holds_run(self.dir, self.config)  # again, under the lock
            if not self.resumed:
                atomic_write(self.dir / OVERRIDES, yaml.safe_dump(self._overrides, sort_keys=False))
            atomic_write(self.dir / CONFIG, yaml.safe_dump(self.config, sort_keys=False))
            self._rewind()
        except OSError as exc:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            raise ConfigError(f"run_dir {self.dir}: cannot write there ({exc.strerror or exc})") from None
        self._materialized = True
        self._jsonl = JsonlSink(self.dir / METRICS)
        if self.resumed:
            log.info("resuming %s from step %d", self.dir, self._record["step"] if self._record else 0)

    @property
    def materialized(self) -> bool:
        """Whether this process took the run directory (:meth:`materialize`: locked and wrote it)."""
        return self._materialized

    def _rewind(self) -> None:
        """Keep what the last checkpoint covers; drop later metric lines and transcripts."""
        records = read_jsonl(self.dir / CHECKPOINTS) if self.resumed else []
        if self.resumed:  # up to the record open() chose (what the loop restores)
            from rlkit.checkpoint_verify import records_through

            records = records_through(records, self._record)
        self._record = records[-1] if records else None
        if not self.resumed:
            return
        if (self.dir / CHECKPOINTS).exists():
            atomic_write(self.dir / CHECKPOINTS, "".join(json.dumps(r) + "\n" for r in records))
        keep_before = self._record["step"] if self._record else 0
        lines = [r for r in read_jsonl(self.dir / METRICS) if r.get("step", 0) < keep_before]
        atomic_write(self.dir / METRICS, "".join(json.dumps(r) + "\n" for r in lines))
        transcripts = self.dir / TRANSCRIPTS
        if transcripts.is_dir():
            for f in transcripts.glob("step_*.jsonl"):
                try:
                    if int(f.stem.split("_")[1]) >= keep_before:
                        f.unlink()
                except (IndexError, ValueError):
                    continue
        if (self.dir / RNG_DIR).is_dir():  # RNG states of checkpoints the rewind dropped
            keep = {r.get("rng_file") for r in records}
            for f in (self.dir / RNG_DIR).glob("step_*.json"):
                if f"{RNG_DIR}/{f.name}" not in keep:
                    f.unlink()
        for stale in (self.dir / PLOT,):
            if stale.exists():
                stale.unlink()

    # -- what loops call -------------------------------------------------------------------------
    def checkpoint_record(self) -> Optional[Dict[str, Any]]:
        """The last checkpoint record (``{"step", "checkpoint", "loop_state", ...}``) or ``None``;
        its ``loop_state`` whole again (the RNG states read back from ``rng_file``)."""
        record = self._record
        if not record or not record.get("rng_file"):
            return record  # a fresh run, or an older run's record with its RNG states inline
        path = self.dir / record["rng_file"]
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"run_dir {self.dir}: cannot resume from step {record['step']}: its RNG state "
                              f"{path} is unreadable ({exc}); start a new run_dir") from None
        return {**record, "loop_state": join_rng(record.get("loop_state") or {}, found)}

    @property
    def start_step(self) -> int:
        return int(self._record["step"]) if self._record else 0

    def _require_materialized(self, what: str) -> None:
        if not self._materialized:
            raise RuntimeError(f"Run.{what}: the run directory {self.dir} is not taken yet; call materialize() first "
                               "(rlkit.scaffold.LoopSession does on entry)")

    @property
    def started(self) -> bool:
        """Whether :meth:`start` opened the console/wandb sinks."""
        return self._started

    def start(self, total: int, *, title: Optional[str] = None) -> None:
        """Open the console/wandb sinks for a run of ``total`` steps (progress bar and ETA); the
        scaffold does (:meth:`rlkit.scaffold.LoopSession.begin`). Lines logged before it reach
        ``metrics.jsonl`` only."""
        if self._started:
            return
        self._require_materialized("start")
        self._started = True
        self.total = total
        self._sinks = make_sinks(self.cfg.logger, self.dir, self.config, total=total, start=self.start_step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one line to ``metrics.jsonl`` and send ``metrics`` to the console/wandb sinks
        :meth:`start` opened."""
        t0 = time.perf_counter()
        self._require_materialized("log")
        assert self._jsonl is not None
        self._jsonl.log(step, metrics)
        for sink in self._sinks:
            sink.log(step, metrics)
        self.log_seconds += time.perf_counter() - t0

    def save_checkpoint(self, step: int, trainer: Any, loop_state: Mapping[str, Any], *, wait: bool = True):
        """``trainer.save_state(...)`` then a ``checkpoints.jsonl`` record ``{step, checkpoint,
        loop_state}``. ``step`` counts completed optimizer steps. With ``wait=False`` the save is
        only queued (so a pipelined loop keeps the session busy): call ``.commit()`` on the result
        once the metrics of steps ``< step`` are logged (:meth:`rlkit.scaffold.LoopSession.end_step`)."""
        self._require_materialized("save_checkpoint")
        state = json.loads(json.dumps(dict(loop_state)))  # snapshot now; must be JSON-able
        pending = PendingCheckpoint(self, int(step), trainer.save_state(f"{self.dir.name} step {step}"), state)
        return pending.commit() if wait else pending

    def _append_checkpoint(self, step: int, checkpoint: str, loop_state: Dict[str, Any]) -> Dict[str, Any]:
        t0 = time.perf_counter()
        state, rng = split_rng(loop_state)
        record = {"step": step, "checkpoint": checkpoint, "time": time.time(), "loop_state": state}
        if rng:  # written (atomically) before the line that names it
            name = f"{RNG_DIR}/step_{step:06d}.json"
            (self.dir / RNG_DIR).mkdir(exist_ok=True)
            atomic_write(self.dir / name, json.dumps(rng) + "\n")
            record["rng_file"] = name
        path = self.dir / CHECKPOINTS
        existing = path.read_text(encoding="utf-8") if path.exists() else ""
        if existing and not existing.endswith("\n"):
            existing = existing[: existing.rfind("\n") + 1]
        atomic_write(path, existing + json.dumps(record) + "\n")
        self._record = record
        self.log_seconds += time.perf_counter() - t0
        return record

    def write_transcript(self, step: int, records: Sequence[Mapping[str, Any]]) -> Path:
        """``transcripts/step_XXXXXX.jsonl``: one JSON line per record (prompt, completion, reward...)."""
        self._require_materialized("write_transcript")
        folder = self.dir / TRANSCRIPTS
        folder.mkdir(exist_ok=True)
        path = folder / f"step_{int(step):06d}.jsonl"
        atomic_write(path, "".join(json.dumps(dict(r), default=str) + "\n" for r in records))
        return path

    def metrics(self) -> List[Dict[str, Any]]:
        """Every line of ``metrics.jsonl`` so far."""
        return read_jsonl(self.dir / METRICS)

    def finish(self, plot_keys: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Close the sinks, plot the main metrics to ``metrics.png``; return the last value of
        every metric."""
        self.close()
        records = self.metrics()
        last: Dict[str, Any] = {}
        for r in records:
            last.update(r)
        try:
            plot_metrics(records, self.dir / PLOT, keys=plot_keys, title=f"{self.config.get('recipe')} — {self.dir.name}")
        except Exception as exc:  # noqa: BLE001 - a plot must never fail a finished run
            log.warning("note: could not plot metrics: %s", exc)
        return last

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sink in self._sinks:
            sink.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def last_checkpoint(run_dir: Path, *, purpose: str = "to start from") -> str:
    """The newest checkpoint id recorded in ``run_dir/checkpoints.jsonl``; :class:`ConfigError`
    naming ``run_dir`` when it has none."""
    records = read_jsonl(Path(run_dir) / CHECKPOINTS)
    if not records:
        raise ConfigError(f"{run_dir}: the run saved no checkpoint {purpose}")
    return str(records[-1]["checkpoint"])


def resume_hint(run_dir: Optional[str]) -> str:
    """Where a run stopped by a failure stands, as a clause for the failure's line: its last
    checkpoint and the command resuming it ("" when the run never started)."""
    if not run_dir or not (Path(run_dir) / CONFIG).is_file():
        return ""
    records = read_jsonl(Path(run_dir) / CHECKPOINTS)
    where = f"the run's last checkpoint is step {records[-1].get('step')}" if records else "the run has no checkpoint yet"
    return f"; {where}: resume it with: rlkit train resume={run_dir}"


# -- result.json -------------------------------------------------------------------------------------


def _finite_json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf", "-inf", "nan": json has no such numbers
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(v) for v in value]
    return value


def write_result(run_dir: Path, **fields: Any) -> Dict[str, Any]:
    """Replace ``run_dir/result.json`` (atomically) with ``fields`` plus the time (non-finite
    numbers as the strings ``"inf"``, ``"-inf"``, ``"nan"``)."""
    record = {**fields, "time": time.time()}
    atomic_write(Path(run_dir) / RESULT, json.dumps(_finite_json(record), indent=1) + "\n")
    return record


def read_result(run_dir: Path) -> Optional[Dict[str, Any]]:
    """``run_dir/result.json``, or ``None`` (none yet, or unreadable)."""
    path = Path(run_dir) / RESULT
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
