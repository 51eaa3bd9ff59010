"""What rlkit's two local stand-ins for a remote service share (``rlkit emulate sagemaker`` and
``rlkit serve tinker``), besides their HTTP stack (:mod:`rlkit.backends.http_service`): the local
engine they both run on, and fault injection.

- :class:`EngineOptions`: the engine options both declare (where checkpoints live, precision,
  threads, batch bounds, fused runs, extra model names), and the engine's arguments made of them;
- :class:`StandInState`: what both states hold besides their own records, from start to close:
  the directory, the engine, one lock, the counters and a reaper thread;
- :class:`FaultOptions`: the fault-injection options both take (``--throttle-rate``,
  ``--error-rate``, ``--lost-response-rate``, ``--latency-ms``, ``--fault-seed``), with one check
  (:meth:`FaultOptions.checked`: rates in [0, 1], latency 0-60 s, an integer seed) that the flags
  at start-up and ``POST /_emulator/config`` / ``POST /_rlkit/config`` while serving go through;
- :class:`InjectsFaults`: the server side: :meth:`~InjectsFaults.configure` (every value checked
  first, the checked value stored; a refused change changes nothing) and the per-request draw
  (:meth:`~InjectsFaults.inject_faults`: throttled, failed, or processed and its response lost).
"""

from __future__ import annotations

import collections
import random
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from rlkit.errors import ConfigError

MAX_LATENCY_MS = 60_000.0
RATES = ("throttle_rate", "error_rate", "lost_response_rate")


def is_number(value: Any) -> bool:
    """A finite int or float (``True`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


@dataclass
class EngineOptions:
    """The local engine under a stand-in (:class:`~rlkit.backends.local.clients.LocalServiceClient`)."""

    state_dir: Optional[str] = None  # checkpoints go here (a temporary directory if None)
    precision: str = "fp32"
    num_threads: Optional[int] = None
    micro_batch_tokens: int = 2048
    max_batch_rows: int = 128
    fuse_runs: bool = True  # concurrent clients' forward/forward_backward share passes (rlkit.backends.local.fusion)
    models: Dict[str, str] = field(default_factory=dict)  # extra model name the service knows -> local model

    def engine_kwargs(self, root: Path) -> Dict[str, Any]:
        """The local engine's arguments, its checkpoints under ``root``."""
        return {
            "precision": self.precision,
            "checkpoint_dir": root / "checkpoints",
            "micro_batch_tokens": self.micro_batch_tokens,
            "max_batch_rows": self.max_batch_rows,
            "num_threads": self.num_threads,
            "fuse_runs": self.fuse_runs,
        }


class StandInState:
    """A stand-in's state, as far as both share it: ``root`` (``state_dir``, or a temporary
    directory removed at :meth:`close`), ``local`` (the engine, ``engine(**options.engine_kwargs(root))``),
    ``lock``, ``stats`` and a daemon thread running :meth:`_reap` until :meth:`close`. A subclass
    builds its own records, then calls :meth:`start_reaper`; :meth:`close` calls its
    :meth:`end_work` before the engine closes."""

    def __init__(self, options: EngineOptions, name: str, engine: Callable[..., Any]):
        self.options = options
        self._name = name
        self._tmp = None if options.state_dir else tempfile.TemporaryDirectory(prefix=f"rlkit-{name}-")
        self.root = Path(options.state_dir) if options.state_dir else Path(self._tmp.name)  # type: ignore[union-attr]
        self.root.mkdir(parents=True, exist_ok=True)
        self.local = engine(**options.engine_kwargs(self.root))
        self.lock = threading.RLock()
        self.stats: collections.Counter = collections.Counter()
        self._closed = threading.Event()

    def start_reaper(self) -> None:
        self._reaper = threading.Thread(target=self._reap, name=f"rlkit-{self._name}-reaper", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        """The reaper thread's loop (returns once ``self._closed`` is set)."""

    def end_work(self) -> None:
        """At :meth:`close`, before the engine closes: end what still runs on it."""

    def close(self) -> None:
        self._closed.set()
        self.end_work()
        self.local.close()
        if self._tmp is not None:
            self._tmp.cleanup()


@dataclass
class FaultOptions:
    """Fault injection. Rates are probabilities per request."""

    throttle_rate: float = 0.0  # throttled (429) before processing
    error_rate: float = 0.0  # a 5xx before processing
    lost_response_rate: float = 0.0  # processed, then a 5xx (the response is lost)
    latency_ms: float = 0.0  # added to every request
    fault_seed: int = 0

    #: the options ``configure`` (``POST .../config``) may change while serving
    FAULT_FIELDS = ("throttle_rate", "error_rate", "lost_response_rate", "latency_ms", "fault_seed")

    @classmethod
    def checked(cls, key: str, value: Any) -> Any:
        """``value`` as the server runs with it, or ``ValueError`` saying what ``key`` takes."""
        if key in RATES:
            if not is_number(value) or not 0 <= value <= 1:
                raise ValueError(f"{key}={value!r} must be a number between 0 and 1")
        elif key == "latency_ms":
            if not is_number(value) or not 0 <= value <= MAX_LATENCY_MS:
                raise ValueError(f"{key}={value!r} must be a number of milliseconds between 0 and {MAX_LATENCY_MS:g}")
        elif key == "fault_seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{key}={value!r} must be an integer")
        else:
            raise ValueError(f"not a fault option: {key}")
        return value


def check_fault_flags(values: Any) -> None:
    """The fault options a stand-in starts with (its options, or its command line's parsed
    arguments), checked as ``configure`` checks them: a ``ConfigError`` naming the flag
    (``--throttle-rate``) otherwise."""
    for key in FaultOptions.FAULT_FIELDS:
        try:
            FaultOptions.checked(key, getattr(values, key))
        except ValueError as exc:
            raise ConfigError(f"--{key.replace('_', '-')}: {exc}") from None


class InjectsFaults:
    """Fault injection on a stand-in's server: ``self.options`` a :class:`FaultOptions`,
    ``self.state.stats`` its counters (``throttled``, ``server_errors``, ``lost_responses``)."""

    options: FaultOptions
    state: Any

    def init_faults(self) -> None:
        check_fault_flags(self.options)
        self._rng = random.Random(self.options.fault_seed)
        self._rng_lock = threading.Lock()

    def configure(self, **changes: Any) -> Dict[str, Any]:
        """Change fault-injection options while serving: every value is checked first, and a
        refused change changes nothing (``ValueError``). Answers the fault options now."""
        fields = type(self.options).FAULT_FIELDS
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"not fault options: {unknown}; allowed: {list(fields)}")
        checked = {key: self.options.checked(key, value) for key, value in changes.items()}
        for key, value in checked.items():
            setattr(self.options, key, value)
        if "fault_seed" in changes:
            with self._rng_lock:
                self._rng = random.Random(self.options.fault_seed)
        return {k: getattr(self.options, k) for k in fields}

    def inject_faults(self, throttled: Callable[[], Exception], failed: Callable[[], Exception]) -> bool:
        """Draw this request's faults: raise ``throttled()`` (``throttle_rate``) or ``failed()``
        (``error_rate``) before it is processed, or answer whether its response is to be lost
        after (``lost_response_rate``)."""
        opts = self.options
        with self._rng_lock:
            a, b = self._rng.random(), self._rng.random()
        if a < opts.throttle_rate:
            self.state.stats["throttled"] += 1
            raise throttled()
        if a < opts.throttle_rate + opts.error_rate:
            self.state.stats["server_errors"] += 1
            raise failed()
        return b < opts.lost_response_rate

