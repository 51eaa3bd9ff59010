"""What a server samples from: a :class:`ModelSource` hands each request a :class:`Snapshot`.

- :class:`FixedModel` — one sampling client (the base model or a saved checkpoint). Its
  :meth:`~FixedModel.update` swaps in another client, which is how a training loop serves its
  *live* weights from the same process::

      source = FixedModel(trainer.save_weights_and_get_sampling_client(), name="my-run")
      server = start_server(create_app(source))          # rlkit.serve.start_server
      ...                                                # every few steps:
      source.update(trainer.save_weights_and_get_sampling_client(), step=step)

- :class:`RunFollower` — a run directory written by ``rlkit train`` (another process, possibly
  still training): it polls ``checkpoints.jsonl`` and serves the newest checkpoint it lists (the base
  model from ``config.yaml`` until the first one). Checkpoints and ``checkpoints.jsonl`` are written
  atomically, so a poll never sees half a checkpoint. A checkpoint is served only once its files
  verify against their recorded checksums and its weights are all finite
  (:func:`servable_problem`); a refused one is logged, the newest earlier checkpoint that passes
  keeps serving, and ``/health`` says ``"status": "degraded"`` with what was refused and why.

A request takes the snapshot current when it starts and finishes on it, even if the weights change
meanwhile; ``system_fingerprint`` and the ``x-rlkit-checkpoint`` response header name the weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

log = logging.getLogger("rlkit.serve")


@dataclass(frozen=True)
class Snapshot:
    client: Any  # a SamplingClient: sample(), get_tokenizer()
    base_model: str
    checkpoint: str = ""  # "" = the base model's own weights
    step: Optional[int] = None
    loaded_at: float = field(default_factory=time.time)

    @property
    def fingerprint(self) -> str:
        return "rlkit-" + hashlib.sha1((self.checkpoint or self.base_model).encode()).hexdigest()[:12]

    def describe(self) -> Dict[str, Any]:
        return {"base_model": self.base_model, "checkpoint": self.checkpoint or None, "step": self.step, "loaded_at": self.loaded_at}


def servable_problem(checkpoint: str) -> Optional[str]:
    """Why a ``local://`` checkpoint must not be served (one line): its files do not verify, or its
    adapter holds NaN/inf. ``None`` if it may be served (or is not a local checkpoint)."""
    from rlkit.backends.local import checkpoints as ckpt
    from rlkit.errors import CheckpointCorruptError, CheckpointNotFoundError

    if not checkpoint.startswith(ckpt.SCHEME):
        return None
    try:
        meta = ckpt.verify(checkpoint, ckpt.SAMPLER_FILES)
        bad = ckpt.nonfinite_tensor(ckpt.load_adapter_tensors(checkpoint, meta))
    except (CheckpointCorruptError, CheckpointNotFoundError) as exc:
        return str(exc)
    return f"checkpoint {checkpoint}: adapter tensor {bad} holds NaN or inf" if bad else None


class ModelSource:
    """Base class: ``name`` (the id clients pass as ``model``), ``aliases``, :meth:`current`."""

    name: str = "rlkit"
    aliases: List[str]

    def current(self) -> Snapshot:
        raise NotImplementedError

    def health(self) -> Dict[str, Any]:
        """What ``/health`` reports besides the snapshot: ``{"status": "ok"}`` unless a source
        knows better."""
        return {"status": "ok"}

    def accepts(self, model: str) -> bool:
        return model == self.name or model in self.aliases

    def close(self) -> None:
        pass


class FixedModel(ModelSource):
    """One sampling client; :meth:`update` swaps weights (thread-safe)."""

    def __init__(self, client: Any, *, name: str, base_model: str = "", checkpoint: str = "", step: Optional[int] = None, aliases: Optional[List[str]] = None):
        self.name = name
        self.aliases = [a for a in (aliases or []) if a and a != name]
        self._lock = threading.Lock()
        self._snapshot = Snapshot(client, base_model or name, checkpoint, step)

    def current(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def update(self, client: Any, *, checkpoint: str = "", step: Optional[int] = None) -> None:
        """Serve ``client`` from now on (requests in flight finish on the old one)."""
        with self._lock:
            self._snapshot = Snapshot(client, self._snapshot.base_model, checkpoint or getattr(client, "weights_key", "") or "", step)


def read_checkpoint_records(run_dir: Path) -> List[Dict[str, Any]]:
    path = Path(run_dir) / "checkpoints.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line (should not happen: the file is replaced atomically)
    return records


def run_base_model(run_dir: Path) -> str:
    import yaml

    config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
    model = config.get("model") or {}
    return str(model.get("base_model") or model.get("name") or "smollm2-135m-instruct")


class RunFollower(ModelSource):
    """Serves the newest checkpoint of a run directory, polling every ``poll_seconds``."""

    def __init__(self, service: Any, run_dir: str | Path, *, name: Optional[str] = None, poll_seconds: float = 2.0):
        from rlkit.errors import ConfigError

        self.run_dir = Path(run_dir).resolve()
        if not (self.run_dir / "config.yaml").is_file():
            raise ConfigError(f"--follow {run_dir}: not an rlkit run directory (no config.yaml)")
        self.service = service
        self.name = name or self.run_dir.name
        self.base_model = run_base_model(self.run_dir)
        self.aliases = [str(self.run_dir)]
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._snapshot = Snapshot(service.create_sampling_client(base_model=self.base_model), self.base_model)
        self._seen: Optional[tuple] = None
        self._refused: Optional[Dict[str, Any]] = None  # the newest checkpoint not served, and why
        self._known_bad: Dict[str, str] = {}  # checkpoint -> why it is not served (checked once)
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="rlkit-serve-follow", daemon=True)
        self._thread.start()

    def current(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def health(self) -> Dict[str, Any]:
        with self._lock:
            refused = dict(self._refused) if self._refused else None
        if refused is None:
            return {"status": "ok"}
        return {"status": "degraded", "refused": refused}

    def refresh(self) -> bool:
        """Serve the newest checkpoint that passes :func:`servable_problem`, if it changed; return
        whether the weights changed. A newer checkpoint that fails is recorded for ``/health``."""
        path = self.run_dir / "checkpoints.jsonl"
        try:
            stat = path.stat()
            key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except FileNotFoundError:
            key = None
        if key == self._seen:
            return False
        self._seen = key
        records = read_checkpoint_records(self.run_dir)
        serving = self.current().checkpoint
        refused: Optional[Dict[str, Any]] = None
        for record in reversed(records):
            checkpoint = str(record.get("checkpoint", ""))
            if checkpoint == serving:
                break
            problem = self._known_bad.get(checkpoint) or servable_problem(checkpoint)
            client = None
            if problem is None:
                try:
                    client = self.service.create_sampling_client(model_package_arn=checkpoint)
                except Exception as exc:  # noqa: BLE001 - keep serving what is served
                    problem = f"checkpoint {checkpoint}: {exc}"
            if problem is not None:
                if checkpoint not in self._known_bad:
                    log.warning("not serving step %s of %s: %s", record.get("step"), self.run_dir, problem)
                self._known_bad[checkpoint] = problem
                refused = refused or {"checkpoint": checkpoint, "step": record.get("step"), "reason": problem}
                continue
            with self._lock:
                self._snapshot = Snapshot(client, self.base_model, checkpoint, int(record.get("step", 0)))
                self._refused = refused
            log.info("serving %s (step %s)", checkpoint, record.get("step"))
            return True
        if records:  # nothing newer to serve: say what was refused, if anything
            with self._lock:
                self._refused = refused
        return False

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001
                log.warning("polling %s failed: %s", self.run_dir, exc)

    def close(self) -> None:
        self._stop.set()
