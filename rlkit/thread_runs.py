"""Many runs in one process, on one local engine: ``rlkit repro ... jobs=shared`` and Hydra
multirun with ``hydra/launcher=rlkit_shared`` (``hydra_plugins/rlkit_shared_launcher``).

Each run is the ``rlkit train`` job it would be alone (:func:`rlkit.sweep.job.run_job`), on a
thread of this process instead of a process of its own. While :func:`shared_runs` is active,
:func:`rlkit.scaffold.connect_backend` gets every run's service from :class:`SharedServices`:
**one** ``LocalServiceClient`` per distinct set of backend options (the run's ``checkpoint_dir``
and ``vllm.log_dir`` aside), so
the base model is in memory once and one sampler worker decodes for every run. Each run sees a
:class:`RunService`: its training sessions write their checkpoints under its own run directory,
and its ``close()`` stops only the sessions it started.

What is process-global in an ``rlkit train`` run, and what a run on a thread does about it:

- **RNG**: :func:`rlkit.rng.own_rng` gives each run thread its own Python/NumPy/torch generators,
  so its seeding and the RNG state its checkpoints carry are what it has alone; sessions are created
  one at a time (the engine seeds a new adapter's initialisation in torch's global generator);
- **console and log lines** (``sys.stdout`` / ``sys.stderr``): routed per thread by
  :class:`_ThreadStreams` (repro discards them, as it discards a run process's; the launcher
  prints whole lines, never a live progress bar, which is one per process);
- **Hydra** (``GlobalHydra``, ``HydraConfig``): repro composes each run's config under
  :data:`COMPOSE_LOCK` (:func:`rlkit.repro.run_in_thread`); the launcher makes ``HydraConfig`` per thread while its jobs run;
- **plots** (pyplot): one at a time (:func:`rlkit.logging.plot_metrics`);
- **signal handlers**: only the main thread installs any (:mod:`rlkit.interrupts`); a Ctrl-C in
  the main thread closes the shared services, which stops every run at its next operation
  (:func:`run_threads`: the runs are daemon threads, so one that does not stop never holds the exit);
- the working directory (``hydra.job.chdir=false``) and environment are never changed by a run.

What cannot be shared is refused in one line before anything runs (:func:`check_shareable`):
a backend other than ``local``, ``backend.nproc > 1``, ``backend.sampler=vllm``, ``logger.wandb``.
The shared service fuses the runs' ``forward``/``forward_backward`` into shared passes
(``LocalServiceClient(fuse_runs=True)``, :mod:`rlkit.backends.local.fusion`) and its sampler
decodes different runs' rows in one batch: a run's numbers are those it gets alone within
floating-point tolerance (batches of other shapes sum in another order).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, TypeVar

from rlkit.errors import ConfigError, RlkitError

T = TypeVar("T")

COMPOSE_LOCK = threading.Lock()  # Hydra's GlobalHydra is one per process: one composition at a time
_ACTIVE: Optional["SharedServices"] = None
_ACTIVE_LOCK = threading.Lock()
_thread = threading.local()  # .stdout / .stderr: where this thread's console output goes


def check_shareable(cfg: Any, how: str) -> None:
    """Refuse, in one line naming ``how`` (``jobs=shared``, ``hydra/launcher=rlkit_shared``), a
    run that cannot be a thread of a shared local engine."""
    backend = cfg.get("backend") or {}
    name = backend.get("name")
    if name != "local":
        raise ConfigError(f"{how} runs every run on one local engine in this process; backend={name} cannot be "
                          "shared: run the jobs as separate processes (jobs=N, or another hydra/launcher)")
    if int(backend.get("nproc") or 1) > 1:
        raise ConfigError(f"{how}: backend.nproc={backend.nproc} runs each run on several processes; use backend.nproc=1")
    if backend.get("sampler", "local") != "local":
        raise ConfigError(f"{how}: backend.sampler={backend.sampler} samples on vLLM servers per run; "
                          "use backend.sampler=local")
    logger = cfg.get("logger") or {}
    if logger.get("wandb"):
        raise ConfigError(f"{how}: logger=wandb keeps one W&B run per process; use logger=console")


class RunService:
    """One run's view of a shared service: training sessions it creates checkpoint under its own
    ``checkpoint_dir``; ``close()`` stops those sessions and leaves the service to the other runs.
    Everything else is the shared service's."""

    _CREATES = ("create_lora_training_client", "create_full_training_client",
                "create_training_client_from_state", "create_training_client_from_state_with_optimizer")

    def __init__(self, service: Any, checkpoint_dir: Path, create_lock: threading.Lock):
        self._service, self._checkpoint_dir, self._create_lock = service, Path(checkpoint_dir), create_lock
        self._clients: List[Any] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._service, name)
        if name not in self._CREATES:
            return attr

        def create(*args: Any, **kwargs: Any) -> Any:
            with self._create_lock:  # a new adapter's initialisation is seeded in torch's global generator
                client = attr(*args, **kwargs)
            client.checkpoint_root = self._checkpoint_dir / client.name
            self._clients.append(client)
            return client

        return create

    @property
    def checkpoint_dir(self) -> Path:
        return self._checkpoint_dir

    def close(self) -> None:
        for client in self._clients:
            client.stop()
        self._clients = []


class SharedServices:
    """The process's shared local services, keyed by their options (see the module docstring)."""

    def __init__(self) -> None:
        self._services: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._create_lock = threading.Lock()
        self.created = 0  # services made (one per distinct backend options)

    def connect(self, name: str, options: Dict[str, Any]) -> RunService:
        import rlkit

        if name != "local":
            raise ConfigError(f"backend={name} cannot be shared between runs of one process (local only)")
        options = dict(options)
        checkpoint_dir = Path(options.pop("checkpoint_dir"))
        if isinstance(options.get("vllm"), dict):  # a run's vLLM log directory: no sampler=vllm here (check_shareable)
            options["vllm"] = {k: v for k, v in options["vllm"].items() if k != "log_dir"}
        key = json.dumps(options, sort_keys=True, default=str)
        with self._lock:
            if key not in self._services:
                self._services[key] = rlkit.connect(name, **options, fuse_runs=True)  # runs' passes fused
                self.created += 1
            service = self._services[key]
        return RunService(service, checkpoint_dir, self._create_lock)

    def close(self) -> None:
        """Close every shared service (their sessions stop: a run still going fails at its next operation)."""
        with self._lock:
            services, self._services = list(self._services.values()), {}
        for service in services:
            service.close()


def active() -> Optional[SharedServices]:
    """The shared services while :func:`shared_runs` is active, else ``None``."""
    return _ACTIVE


class _ThreadStreams:
    """``sys.stdout`` / ``sys.stderr`` while runs share the process: a run thread's writes go
    where :func:`thread_run` said (a complete line at a time, never a terminal); other threads'
    go to the stream that was there before."""

    def __init__(self, which: str, default: Any):
        self._which, self._default = which, default

    def _target(self) -> Any:
        return getattr(_thread, self._which, None)

    def write(self, text: str) -> int:
        target = self._target()
        return self._default.write(text) if target is None else target.write(text)

    def flush(self) -> None:
        target = self._target()
        (self._default if target is None else target).flush()

    def isatty(self) -> bool:
        return self._default.isatty() if self._target() is None else False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._default, name)


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class _Lines:
    """Whole lines to ``stream``, one writer at a time (print writes a line's text and its end apart)."""

    _lock = threading.Lock()

    def __init__(self, stream: Any):
        self._stream, self._pending = stream, ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            done, _, self._pending = self._pending.rpartition("\n")
            with self._lock:
                self._stream.write(done + "\n")
                self._stream.flush()
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def shared_runs() -> Iterator[SharedServices]:
    """Make runs started in this process (on threads, :func:`thread_run`) share local services
    until the block ends; then close them. Not reentrant."""
    global _ACTIVE
    with _ACTIVE_LOCK:
        if _ACTIVE is not None:
            raise RlkitError("shared runs are already active in this process")
        _ACTIVE = services = SharedServices()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ThreadStreams("stdout", saved[0]), _ThreadStreams("stderr", saved[1])
    try:
        yield services
    finally:
        try:
            services.close()
        finally:
            sys.stdout, sys.stderr = saved
            with _ACTIVE_LOCK:
                _ACTIVE = None


@contextlib.contextmanager
def thread_run(*, console: str) -> Iterator[None]:
    """The calling thread runs one run: its own RNG state (:func:`rlkit.rng.own_rng`) and its
    console output ``"discard"``-ed or printed as ``"lines"``."""
    from rlkit.rng import own_rng

    if console not in ("discard", "lines"):
        raise ValueError(f"console={console!r}: discard | lines")
    own_rng()
    for which in ("stdout", "stderr"):
        stream = getattr(sys, which)
        stream = stream._default if isinstance(stream, _ThreadStreams) else stream
        setattr(_thread, which, _Discard() if console == "discard" else _Lines(stream))
    try:
        yield
    finally:
        _thread.stdout = _thread.stderr = None


def run_threads(tasks: Sequence[Callable[[], T]], *, max_at_once: Optional[int] = None, grace_s: float = 30.0) -> List[T]:
    """Run each task on a daemon thread of its own, at most ``max_at_once`` at a time, inside
    :func:`shared_runs`; return their results in order. A task's failure does not stop the others:
    the first failure is raised once every task has ended. A ``KeyboardInterrupt`` (or any
    exception) in the calling thread closes the shared services, so every run stops at its next
    operation and records how it ended, waits up to ``grace_s`` for them, and propagates; a run
    still going then (waiting on work the closed engine will never do) ends the process at once,
    exit 130, as a third Ctrl-C does (:mod:`rlkit.interrupts`)."""
    services = active()
    if services is None:
        raise RlkitError("run_threads runs shared runs: call it inside shared_runs()")
    results: List[Any] = [None] * len(tasks)
    errors: List[Optional[BaseException]] = [None] * len(tasks)
    slots = threading.Semaphore(max_at_once or max(1, len(tasks)))

    def body(i: int) -> None:
        try:
            results[i] = tasks[i]()
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread once all have ended
            errors[i] = exc
        finally:
            slots.release()

    threads: List[threading.Thread] = []
    try:
        for i in range(len(tasks)):
            slots.acquire()
            threads.append(threading.Thread(target=body, args=(i,), name=f"rlkit-run-{i}", daemon=True))
            threads[-1].start()
        for t in threads:
            t.join()
    except BaseException:
        services.close()
        deadline = time.monotonic() + grace_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(t.is_alive() for t in threads)
        if stuck:  # a run waiting on work its closed engine will never do would hold the exit forever
            from rlkit import interrupts

            interrupts.say(f"rlkit: {stuck} run(s) did not stop within {grace_s:.0f} s of their engine closing; "
                           "quitting now (checkpoints are written atomically: rerun the command to resume)")
            interrupts.flush_streams()
            os._exit(130)
        raise
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results
