"""The samples the Tinker server is running, and what cancels them.

A sample is cancelled — its future fails in one line, and the local sampler drops its rows at the
next decode step (or skips it if it is still queued) — when

- its session finishes or expires (no heartbeat for ``session_timeout_s``), or its sampling
  session is released (:meth:`InFlight.cancel_sampler`);
- its client gives up on it: the SDK sends ``cancel_future`` for a sample whose polling was
  abandoned (the server's dynamic config enables it) (:meth:`InFlight.cancel`);
- it runs past the server's per-request deadline (``request_deadline_s``, measured from submit;
  0 = none), checked by one watcher thread.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Any, Dict, List, Optional, Tuple


class InFlight:
    """Running samples by request id: ``(server future, local future, sampler id, owner)``."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._running: Dict[str, Tuple[Any, Any, str, Optional[str]]] = {}
        self._deadlines: List[Tuple[float, str, float]] = []  # (monotonic deadline, request id, seconds)
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def add(self, future: Any, local: Any, sampler_id: str, owner: Optional[str], deadline_s: float) -> None:
        with self._lock:
            self._running[future.request_id] = (future, local, sampler_id, owner)
            if deadline_s and deadline_s > 0:
                heapq.heappush(self._deadlines, (time.monotonic() + deadline_s, future.request_id, deadline_s))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name="rlkit-tinker-deadlines", daemon=True)
                    self._thread.start()
                self._lock.notify()

    def done(self, request_id: str) -> None:
        with self._lock:
            self._running.pop(request_id, None)

    def cancel(self, request_id: str, message: str, owner: Optional[str] = None) -> bool:
        """Fail the sample's future with ``message`` and stop its decode; ``False`` if it is not
        running (finished, unknown, or another owner's)."""
        with self._lock:
            entry = self._running.get(request_id)
            if entry is None or (owner is not None and entry[3] is not None and entry[3] != owner):
                return False
            self._running.pop(request_id)
        future, local, _, _ = entry
        future.finish(error=message, category="user")
        local.cancel()
        return True

    def cancel_sampler(self, sampler_id: str, message: str) -> int:
        with self._lock:
            ids = [rid for rid, entry in self._running.items() if entry[2] == sampler_id]
        return sum(1 for rid in ids if self.cancel(rid, message))

    def count(self) -> int:
        with self._lock:
            return len(self._running)

    def _watch(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (not self._deadlines or self._deadlines[0][0] > time.monotonic()):
                    wait = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
                    self._lock.wait(wait)
                if self._closed:
                    return
                _, rid, seconds = heapq.heappop(self._deadlines)
            self.cancel(rid, f"sample: cancelled, it ran past the server's request deadline of {seconds:g} s (--request-deadline-s)")

    def close(self, message: str) -> None:
        with self._lock:
            self._closed = True
            ids = list(self._running)
            self._lock.notify()
        for rid in ids:
            self.cancel(rid, message)
