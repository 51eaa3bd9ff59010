"""Worker threads of the local backend.

- :class:`OrderedWorker` runs training operations one at a time, strictly in submission order.
- :class:`SamplerWorker` decodes queued sampling requests as one batch, and lets requests that
  arrive while it decodes join that batch between steps (continuous batching, where the sampler's
  decode loop supports it), so concurrent ``sample`` calls share a decode even when they arrive a
  few milliseconds apart. Requests for *different* LoRA weights on the same base (and for the base
  model) share a batch: the sampler then decodes per row, unmerged (:mod:`.row_lora`); full
  fine-tuning weights decode alone (only jobs of the same weights join them). Jobs are served in
  arrival order: a batch takes, and later admits, only the jobs at the front of the queue that can
  join it (weights it can hold, within ``max_batch_rows``; ``compute_logprobs`` jobs only at its
  start), so nothing waits behind a stream of newer requests.

A queued operation whose future was cancelled (:meth:`~rlkit.futures.APIFuture.cancel`) is
skipped; a running ``sample`` whose future is cancelled loses its rows at the next decode step.

**Interpreter exit.** The workers are daemon threads, and a daemon thread still inside torch when
the interpreter finalizes aborts the process (``terminate called without an active exception``,
exit 134). So an :mod:`atexit` hook (:func:`shutdown_all`) stops every live worker and waits for it
before finalization starts, and the process exits with its own code:

- a normal exit *drains* the training queues: operations that were submitted and not waited for
  still run (as they would on a remote service, where they were already accepted), so a final
  un-awaited ``save_state`` is written;
- an exit caused by an uncaught exception (``KeyboardInterrupt`` included), or after a Ctrl-C
  interrupted ``stop()``, *cancels* queued operations: only the one running finishes;
- queued sampling is always cancelled at exit (it has no effect anyone could see), and a running
  decode stops at its next step;
- the ``rlkit`` command's second Ctrl-C (:mod:`rlkit.interrupts`) skips every queued operation
  (:func:`abandon_queued`), without raising anywhere;
- Ctrl-C while the hook waits cancels what is queued; a second Ctrl-C exits at once with 130
  (``os._exit``, so the interpreter never finalizes under a running thread); once the hook is
  done, SIGINT is ignored for the little that is left of finalization.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import logging
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from rlkit.backends.local.threadpools import release_idle_pool
from rlkit.backends.local.twins import Twins, adds_nothing, twin_key
from rlkit.errors import ClientStoppedError
from rlkit.futures import APIFuture
from rlkit.interrupts import flush_streams, say

log = logging.getLogger(__name__)
_STOP = object()
_LIVE: "weakref.WeakSet[_Worker]" = weakref.WeakSet()
_interrupted = threading.Event()  # a Ctrl-C interrupted a wait on a worker: cancel, don't drain, at exit
_abandoned = threading.Event()  # the rlkit command's second Ctrl-C: every queued operation is skipped


def abandon_queued() -> None:
    """Skip every operation still queued on any worker of this process (each is cancelled when its
    turn comes; the running one finishes). Safe to call from a signal handler: it only sets a flag
    that the worker threads read."""
    _abandoned.set()
    _interrupted.set()


class _Worker:
    """A FIFO served by one daemon thread; the subclass's ``_serve(item)`` handles each item."""

    def __init__(self, name: str):
        self._items: Deque[Any] = collections.deque()
        self._ready = threading.Condition()
        self._pid = os.getpid()
        self._finished = threading.Event()  # not Thread.join: an interrupted join marks the thread stopped (3.11)
        self._closed = False  # set by close(): later work is refused, never queued behind the stop
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    # -- the queue ----------------------------------------------------------------------------------
    def _put(self, item: Any) -> None:
        with self._ready:
            if item is _STOP:
                self._closed = True
            elif self._closed:  # queued behind the stop it would never run and its future never end
                self._future_of(item).set_exception(ClientStoppedError(
                    f"{self._future_of(item).operation}: the local engine was closed before it could run"))
                return
            self._items.append(item)
            self._ready.notify()

    def _get(self) -> Any:
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()

    def _get_nowait(self) -> Any:
        with self._ready:
            return self._items.popleft() if self._items else None

    def _loop(self) -> None:
        try:
            while True:
                item = self._get_nowait()
                if item is None:  # idle: give the cores back to whichever thread computes next
                    release_idle_pool()
                    item = self._get()
                if item is _STOP:
                    return
                self._serve(item)
        finally:
            self._finished.set()

    def _serve(self, item: Any) -> None:
        raise NotImplementedError

    @staticmethod
    def _future_of(item: Any) -> APIFuture:
        raise NotImplementedError

    # -- stopping -----------------------------------------------------------------------------------
    def cancel_pending(self) -> int:
        """Cancel every queued item (it will be skipped); return how many were cancelled."""
        with self._ready:
            queued = [item for item in self._items if item is not _STOP]
        return sum(1 for item in queued if self._future_of(item).cancel())

    def close(self, wait: bool = True, *, cancel: bool = False) -> None:
        """Stop the thread after the queued work (``cancel=True``: after the running item only)."""
        if cancel:
            self.cancel_pending()
        self._put(_STOP)
        if wait:
            self.join()

    def join(self) -> None:
        """Wait for the thread to end. A Ctrl-C while waiting cancels the queued work (so that the
        exit hook does not run it) and propagates."""
        if threading.current_thread() is self._thread or self._pid != os.getpid():
            return
        try:
            while not self._finished.is_set():  # polled: Event.wait's lock could be left held by a Ctrl-C
                time.sleep(0.01)
        except KeyboardInterrupt:
            _interrupted.set()
            self.cancel_pending()
            raise

    @property
    def alive(self) -> bool:
        return self._pid == os.getpid() and not self._finished.is_set()


class OrderedWorker(_Worker):
    """A FIFO of closures executed on one daemon thread; each completes its own future."""

    def submit(self, fn: Callable[[], Any], *, operation: str) -> APIFuture:
        future: APIFuture = APIFuture(operation=operation)
        self._put((fn, future))
        return future

    @staticmethod
    def _future_of(item: Any) -> APIFuture:
        return item[1]

    def _serve(self, item: Any) -> None:
        fn, future = item
        if _abandoned.is_set():
            future.cancel()
        if not future.set_running():  # cancelled while queued
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            future.set_exception(exc)


@dataclass
class SamplingJob:
    weights_key: str
    kind: str  # "sample" | "logprobs"
    payload: Any
    future: APIFuture


class SamplerWorker(_Worker):
    """Batches queued sampling jobs and runs them on one :class:`~.sampler.Sampler`.

    ``load_adapter(key)`` returns the adapter for a weights key ("" = base model); the last few
    are kept in memory. ``decodes`` counts the decode batches run, ``mixed_decodes`` those that
    held more than one weights key, and ``last_batch_keys`` is the set of keys of the last one.
    ``mix=False``: one weights key per decode batch (and per ``compute_logprobs`` group), merged,
    as before issue 43 (``LocalServiceClient(fuse_runs=False)``, ``--no-fuse-runs``). With ``mix``,
    a LoRA adapter that adds nothing (every ``B`` zero: a run before its first step) samples as the
    base model, and identical deterministic requests on the base are decoded once
    (:mod:`.twins`; ``twins.answered`` counts the requests answered so).
    """

    def __init__(
        self, sampler: Any, load_adapter: Callable[[str], Any], *, max_batch_rows: int = 128, cache_size: int = 4,
        mix: bool = True,
    ):
        self.sampler = sampler
        self.mix = bool(mix)
        self._load_adapter = load_adapter
        self.max_batch_rows = max_batch_rows
        self._adapters: "OrderedDict[str, Any]" = OrderedDict()
        self._pinned: Dict[str, Any] = {}  # in-memory weights (no files): kept while a client holds them
        self._holders: Dict[str, int] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._closing = False  # set at close: a running decode stops at its next step
        self.decodes = 0
        self.mixed_decodes = 0
        self.last_batch_keys: frozenset = frozenset()
        self.twins = Twins()
        self._redo: List[SamplingJob] = []  # twins whose first did not finish: they decode themselves
        self._adds_nothing: "OrderedDict[str, Tuple[int, bool]]" = OrderedDict()  # key -> (id of its adapter, adds nothing)
        super().__init__("rlkit-sampler")

    def submit(self, job: SamplingJob) -> APIFuture:
        self._put(job)
        return job.future

    @staticmethod
    def _future_of(item: Any) -> APIFuture:
        return item.future

    def remember(self, key: str, adapter: Any) -> None:
        """Pre-load an adapter snapshot under ``key`` (saves a disk read right after a save)."""
        with self._lock:
            self._adapters[key] = adapter
            self._adapters.move_to_end(key)
            while len(self._adapters) > self._cache_size:
                self._adapters.popitem(last=False)

    def pin(self, key: str, adapter: Any) -> None:
        """Hold in-memory weights under ``key`` while clients :meth:`retain` them (never on disk)."""
        with self._lock:
            self._pinned[key] = adapter
            self._holders.setdefault(key, 0)

    def retain(self, key: str) -> None:
        with self._lock:
            self._holders[key] = self._holders.get(key, 0) + 1

    def release(self, key: str) -> None:
        """One holder fewer; the weights go with the last one."""
        with self._lock:
            self._holders[key] = self._holders.get(key, 1) - 1
            if self._holders[key] <= 0:
                self._holders.pop(key, None)
                self._pinned.pop(key, None)

    def is_pinned(self, key: str) -> bool:
        with self._lock:
            return key in self._pinned

    def _adapter(self, key: str) -> Any:
        if key == "":
            return None
        with self._lock:
            if key in self._pinned:
                return self._pinned[key]
            if key in self._adapters:
                self._adapters.move_to_end(key)
                return self._adapters[key]
        adapter = self._load_adapter(key)
        self.remember(key, adapter)
        return adapter

    def _effective(self, key: str) -> Tuple[str, Any]:
        """The weights ``key`` samples from: ``("", None)`` (the base) for a LoRA adapter that adds
        nothing when batches mix, else ``(key, its adapter)``."""
        adapter = self._adapter(key)
        if not self.mix or adapter is None:
            return key, adapter
        known = self._adds_nothing.get(key)  # ids, not the adapters: evicted weights are not kept alive
        if known is None or known[0] != id(adapter):
            known = (id(adapter), adds_nothing(adapter))
            self._adds_nothing[key] = known
            while len(self._adds_nothing) > 4 * self._cache_size:
                self._adds_nothing.popitem(last=False)
        self._adds_nothing.move_to_end(key)
        return ("", None) if known[1] else (key, adapter)

    @staticmethod
    def _rows(job: SamplingJob) -> int:
        return job.payload.num_samples if job.kind == "sample" else 1

    def _mixes(self, job: SamplingJob) -> bool:
        """Whether ``job``'s weights can share a batch with other weights (per row). Loads them."""
        if not self.mix:
            return False
        return self.sampler.routable(self._adapter(job.weights_key)) is None

    def _fits(self, key: str, mixed: bool) -> Callable[[SamplingJob], bool]:
        """Which jobs a batch of ``key`` can take: with ``mixed``, any whose weights mix; else ``key``'s."""
        return self._mixes if mixed else (lambda job: job.weights_key == key)

    def _take(self, fits: Callable[[SamplingJob], bool], rows: int, kinds=("sample",)) -> List[SamplingJob]:
        """Jobs from the front of the queue while ``fits(job)``, of ``kinds`` and within ``rows``
        more rows (cancelled ones are skipped; one whose weights fail to load fails alone); stops at
        the first that is not, so arrival order is never overtaken. ``fits`` may load weights: it
        runs outside the queue's lock (only this thread takes items, so the front stays the front)."""
        taken: List[SamplingJob] = []
        while True:
            with self._ready:
                job = self._items[0] if self._items else _STOP
                if job is _STOP or job.kind not in kinds or self._rows(job) > rows:
                    break
            try:
                ok, failure = fits(job), None
            except Exception as exc:  # noqa: BLE001 - this job's weights: its own failure
                ok, failure = True, exc
            if not ok:
                break
            with self._ready:
                self._items.popleft()
            if not job.future.set_running():
                continue
            if failure is not None:
                job.future.set_exception(failure)
                continue
            taken.append(job)
            rows -= self._rows(job)
        return taken

    def _drain(self, first: SamplingJob) -> List[SamplingJob]:
        """``first`` and the jobs queued right behind it that can share its batch (any mixing
        weights when ``first``'s mix, else the same weights), up to ``max_batch_rows`` rows
        (cancelled ones skipped)."""
        if not first.future.set_running():
            return []
        try:
            mixed = self._mixes(first)
        except Exception as exc:  # noqa: BLE001 - its weights failed to load: it fails alone
            first.future.set_exception(exc)
            return []
        rows = self._rows(first)
        return [first] + self._take(self._fits(first.weights_key, mixed), self.max_batch_rows - rows, kinds=("sample", "logprobs"))

    def _serve(self, first: Any) -> None:
        jobs = self._drain(first)
        if jobs:
            self._run_group(first.weights_key, jobs)

    def _stopped(self, job: SamplingJob) -> bool:
        return self._closing or job.future.cancel_requested or _abandoned.is_set()

    def _cancel(self, job: SamplingJob) -> None:
        job.future.set_exception(concurrent.futures.CancelledError(f"{job.future.operation} was cancelled"))

    def _weigh(self, job: SamplingJob) -> bool:
        """Give a sample job's request its weights; ``False`` (the job failed) if they fail to load."""
        try:
            job.payload.for_weights(*self._effective(job.weights_key))
            return True
        except BaseException as exc:  # noqa: BLE001 - this job's own failure
            job.future.set_exception(exc)
            return False

    def _run_group(self, key: str, group: List[SamplingJob]) -> None:
        """Run ``group`` (jobs of ``key``, or of several mixing weights) as one decode batch, which
        admits more jobs between steps; then its ``compute_logprobs`` jobs."""
        for job in [j for j in group if self._stopped(j)]:
            self._cancel(job)
        group = [j for j in group if not j.future.done()]
        if not group:
            return
        samples = [j for j in group if j.kind == "sample" and self._weigh(j) and self._claim(j)]
        while samples:
            self._decode(key, samples)
            samples, self._redo = [j for j in self._redo if not j.future.done()], []
        self._score([j for j in group if j.kind == "logprobs"])

    def _score(self, jobs: List[SamplingJob]) -> None:
        """``compute_logprobs`` jobs, those of the same weights scored together (shared prompt
        prefixes computed once: :mod:`.scoring`); if a shared pass fails, each job alone, so only
        the one at fault fails."""
        by_weights: Dict[str, Tuple[Any, List[SamplingJob]]] = {}
        for job in jobs:
            if self._stopped(job):
                self._cancel(job)
                continue
            try:
                key, adapter = self._effective(job.weights_key)
            except BaseException as exc:  # noqa: BLE001 - its weights failed to load: it fails alone
                job.future.set_exception(exc)
                continue
            by_weights.setdefault(key, (adapter, []))[1].append(job)
        for key, (adapter, same) in by_weights.items():
            try:
                values = self.sampler.score_batch([j.payload for j in same], key, adapter)
            except Exception:  # noqa: BLE001 - retried one at a time below
                values = None
            for i, job in enumerate(same):
                if values is not None:
                    job.future.set_result(values[i])
                    continue
                try:
                    job.future.set_result(self.sampler.score(job.payload, key, adapter))
                except BaseException as exc:  # noqa: BLE001
                    job.future.set_exception(exc)

    def _claim(self, job: SamplingJob) -> bool:
        """Whether ``job`` (weighed) decodes; if not, a twin answered it or will (:mod:`.twins`)."""
        if not self.mix:
            return True
        verdict, response = self.twins.claim(job, twin_key(job.payload))
        if verdict == "answered":
            job.future.set_result(response)
        return verdict == "decode"

    def _answer_twins(self, job: SamplingJob, response: Any) -> None:
        """``job`` finished (``response`` ``None``: it did not): answer the twins waiting on it, or
        have them decode themselves."""
        for twin, answer in self.twins.settle(job, response):
            if self._stopped(twin):
                self._cancel(twin)
            elif answer is None:
                self._redo.append(twin)
            else:
                twin.future.set_result(answer)

    def _decode(self, key: str, samples: List[SamplingJob]) -> None:
        """Decode ``samples`` (weighed and claimed) as one batch that admits more jobs between steps."""
        job_of = {id(j.payload): j for j in samples}
        try:
            mixed = all(self._mixes(j) for j in samples)  # loaded by _weigh: no new failure here
        except Exception:  # noqa: BLE001
            mixed = False
        fits = self._fits(key, mixed)
        self._count_batch([j.weights_key for j in samples], new=True)

        def admit(live_rows: int) -> list:
            joining, room = [], self.max_batch_rows - live_rows
            while self._redo and self._rows(self._redo[0]) <= room and fits(self._redo[0]):
                joining.append(self._redo.pop(0))
                room -= self._rows(joining[-1])
            for job in self._take(fits, room):
                if self._stopped(job):
                    self._cancel(job)
                elif self._weigh(job) and self._claim(job):
                    joining.append(job)
            for job in joining:
                job_of[id(job.payload)] = job
            self._count_batch([j.weights_key for j in joining])
            return [j.payload for j in joining]

        def done(request: Any, response: Any) -> None:
            job = job_of[id(request)]
            if response is None:
                self._cancel(job)
            else:
                job.future.set_result(response)
            self._answer_twins(job, response)

        try:
            self.sampler.sample([j.payload for j in samples], admit=admit, on_done=done,
                                cancelled=lambda request: self._stopped(job_of[id(request)]))
        except BaseException as exc:  # noqa: BLE001
            self._isolate([j for j in job_of.values() if not j.future.done()], exc, done)
        for job in job_of.values():  # a first that failed: its twins decode themselves
            self._answer_twins(job, None)

    def _count_batch(self, keys: List[str], new: bool = False) -> None:
        """Count a decode batch (``new``) or jobs joining it, before they run (so a caller that has
        its result sees the counts): ``decodes``, ``mixed_decodes``, ``last_batch_keys``."""
        before = frozenset() if new else self.last_batch_keys
        self.last_batch_keys = before | frozenset(keys)
        self.decodes += new
        self.mixed_decodes += len(self.last_batch_keys) > 1 >= len(before)

    def _isolate(self, pending: List[SamplingJob], exc: BaseException, done: Callable[[Any, Any], None]) -> None:
        """A shared decode failed: one request's fault must not fail its batchmates, so each
        unfinished request is decoded again alone (same seed, same tokens); only the one that
        fails alone fails. A listener (``on_token``) does not hear the tokens it already heard."""
        if len(pending) == 1 or not isinstance(exc, Exception):
            for job in pending:
                job.future.set_exception(exc)
            return
        log.warning("a shared decode failed (%s: %s); retrying its %d requests one at a time",
                    type(exc).__name__, exc, len(pending))
        for job in pending:
            if self._stopped(job):
                self._cancel(job)
                continue
            request = job.payload
            request.restart()
            try:
                self.sampler.sample([request], on_done=done, cancelled=lambda r, job=job: self._stopped(job))
            except BaseException as alone:  # noqa: BLE001 - this request's own fault
                if not job.future.done():
                    job.future.set_exception(alone)

    def close(self, wait: bool = True, *, cancel: bool = True) -> None:
        """Stop sampling: queued requests are cancelled and a running decode stops at its next
        step (nothing a sampler computes outlives it)."""
        self._closing = True
        super().close(wait, cancel=cancel)


def make_job(weights_key: str, kind: str, payload: Any, operation: str) -> SamplingJob:
    return SamplingJob(weights_key=weights_key, kind=kind, payload=payload, future=APIFuture(operation=operation))


def _crashed() -> bool:
    """Whether the interpreter is exiting because of an uncaught exception (set by its printer)."""
    return getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None


def shutdown_all(*, cancel: Optional[bool] = None) -> None:
    """Stop every live worker of this process and wait for it (the :mod:`atexit` hook; see the
    module docstring). ``cancel=None`` decides as at exit: cancel after a crash or a Ctrl-C."""
    workers = [w for w in list(_LIVE) if w.alive]
    if not workers:
        return
    if cancel is None:
        cancel = _crashed() or _interrupted.is_set()
    try:
        for w in workers:
            w.close(wait=False, cancel=cancel or isinstance(w, SamplerWorker))
        for w in workers:
            w.join()
    except KeyboardInterrupt:
        say("rlkit: interrupted at exit: queued operations cancelled, waiting for the running one "
             "(Ctrl-C again to quit now)")
        try:
            for w in workers:
                w.close(wait=False, cancel=True)
            for w in workers:
                w.join()
        except KeyboardInterrupt:
            flush_streams()
            os._exit(130)  # never finalize the interpreter under a thread that is inside torch


def _at_exit() -> None:
    shutdown_all()
    # Nothing of ours runs any more: a late Ctrl-C must not turn the exit code into "killed by
    # SIGINT" while the interpreter finalizes (Python resets a handled SIGINT to the default then).
    if threading.current_thread() is threading.main_thread():
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)


atexit.register(_at_exit)
