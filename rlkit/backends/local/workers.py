"""Worker threads of the local backend.

- :class:`OrderedWorker` runs training operations one at a time, strictly in submission order.
- :class:`SamplerWorker` drains every sampling request queued at the moment it wakes and decodes
  them as one batch (grouped by weights), so concurrent ``sample`` calls share a decode.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

from rlkit.futures import APIFuture

_STOP = object()


class OrderedWorker:
    """A FIFO of closures executed on one daemon thread; each completes its own future."""

    def __init__(self, name: str):
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], *, operation: str) -> APIFuture:
        future: APIFuture = APIFuture(operation=operation)
        self._queue.put((fn, future))
        return future

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, future = item
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                future.set_exception(exc)

    def close(self, wait: bool = True) -> None:
        """Finish queued work, then stop the thread."""
        self._queue.put(_STOP)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()


@dataclass
class SamplingJob:
    weights_key: str
    kind: str  # "sample" | "logprobs"
    payload: Any
    future: APIFuture


class SamplerWorker:
    """Batches queued sampling jobs and runs them on one :class:`~.sampler.Sampler`.

    ``load_adapter(key)`` returns the adapter for a weights key ("" = base model); the last few
    are kept in memory.
    """

    def __init__(self, sampler: Any, load_adapter: Callable[[str], Any], *, max_batch_rows: int = 128, cache_size: int = 4):
        self.sampler = sampler
        self._load_adapter = load_adapter
        self.max_batch_rows = max_batch_rows
        self._adapters: "OrderedDict[str, Any]" = OrderedDict()
        self._pinned: Dict[str, Any] = {}  # in-memory weights (no files): kept while a client holds them
        self._holders: Dict[str, int] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="rlkit-sampler", daemon=True)
        self._thread.start()

    def submit(self, job: SamplingJob) -> APIFuture:
        self._queue.put(job)
        return job.future

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

    def _drain(self, first: SamplingJob) -> List[SamplingJob]:
        jobs = [first]
        rows = first.payload.num_samples if first.kind == "sample" else 1
        while rows < self.max_batch_rows:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                self._queue.put(_STOP)
                break
            jobs.append(job)
            rows += job.payload.num_samples if job.kind == "sample" else 1
        return jobs

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            jobs = self._drain(first)
            by_key: Dict[str, List[SamplingJob]] = {}
            for job in jobs:
                by_key.setdefault(job.weights_key, []).append(job)
            for key, group in by_key.items():
                self._run_group(key, group)

    def _run_group(self, key: str, group: List[SamplingJob]) -> None:
        try:
            self.sampler.set_weights(key, self._adapter(key))
        except BaseException as exc:  # noqa: BLE001
            for job in group:
                job.future.set_exception(exc)
            return
        samples = [j for j in group if j.kind == "sample"]
        if samples:
            try:
                results = self.sampler.sample([j.payload for j in samples])
                for job, result in zip(samples, results):
                    job.future.set_result(result)
            except BaseException as exc:  # noqa: BLE001
                for job in samples:
                    if not job.future.done():
                        job.future.set_exception(exc)
        for job in (j for j in group if j.kind == "logprobs"):
            try:
                job.future.set_result(self.sampler.prompt_logprobs(job.payload)[0])
            except BaseException as exc:  # noqa: BLE001
                job.future.set_exception(exc)

    def close(self, wait: bool = True) -> None:
        self._queue.put(_STOP)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()


def make_job(weights_key: str, kind: str, payload: Any, operation: str) -> SamplingJob:
    return SamplingJob(weights_key=weights_key, kind=kind, payload=payload, future=APIFuture(operation=operation))

