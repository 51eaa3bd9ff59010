"""``APIFuture``: the handle every session operation returns at once.

Wraps a :class:`concurrent.futures.Future` with the SDK's surface: ``result(timeout)``,
``await future`` (or ``result_async``), ``done()``, ``exception()``. A backend completes it from
its worker thread; errors raised by the operation are re-raised by ``result()``.

``cancel()`` (as :meth:`concurrent.futures.Future.cancel`) stops an operation that has not started:
it never runs and ``result()`` raises :class:`concurrent.futures.CancelledError`. For one already
running it is a request the backend honours where it can (the local sampler drops the request's
rows at its next decode step); the local backend also cancels queued work when the interpreter
exits after an error (:mod:`rlkit.backends.local.workers`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Generic, Optional, TypeVar

T = TypeVar("T")
U = TypeVar("U")

DEFAULT_TIMEOUT: Optional[float] = None


class APIFuture(Generic[T]):
    """The pending result of one operation."""

    def __init__(self, future: Optional[concurrent.futures.Future] = None, *, operation: str = ""):
        self._future: concurrent.futures.Future = future or concurrent.futures.Future()
        self.operation = operation
        self._cancel_requested = threading.Event()

    # -- completion (backend side) -------------------------------------------------------------
    def set_running(self) -> bool:
        """Mark the operation as started; ``False`` if it was cancelled first (then skip it)."""
        return self._future.set_running_or_notify_cancel()

    def set_result(self, value: T) -> None:
        try:
            self._future.set_result(value)
        except concurrent.futures.InvalidStateError:
            if not self._future.cancelled():  # a cancelled operation's late result is dropped
                raise

    def set_exception(self, exc: BaseException) -> None:
        try:
            self._future.set_exception(exc)
        except concurrent.futures.InvalidStateError:
            if not self._future.cancelled():
                raise

    @property
    def cancel_requested(self) -> bool:
        """Whether :meth:`cancel` was called (a running operation checks this to stop early)."""
        return self._cancel_requested.is_set()

    @classmethod
    def completed(cls, value: T, *, operation: str = "") -> "APIFuture[T]":
        fut: APIFuture[T] = cls(operation=operation)
        fut.set_result(value)
        return fut

    # -- user side --------------------------------------------------------------------------------
    def result(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> T:
        """Block until the operation finishes; return its result or raise its error."""
        return self._future.result(timeout)

    async def result_async(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> T:
        wrapped = asyncio.wrap_future(self._future)
        return await asyncio.wait_for(wrapped, timeout) if timeout else await wrapped

    def __await__(self):
        return self.result_async().__await__()

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> bool:
        """Cancel the operation. ``True`` if it had not started (it never will); for a running one,
        ``False``, and the backend stops it where it can (see the module docstring)."""
        self._cancel_requested.set()
        return self._future.cancel()

    def cancelled(self) -> bool:
        return self._future.cancelled()

    def exception(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> Optional[BaseException]:
        return self._future.exception(timeout)

    def add_done_callback(self, fn: Callable[["APIFuture[T]"], Any]) -> None:
        self._future.add_done_callback(lambda _f: fn(self))

    def then(self, fn: Callable[[T], U], *, operation: str = "") -> "APIFuture[U]":
        """A future of ``fn(result)``, computed when this one finishes (errors propagate)."""
        out: APIFuture[U] = APIFuture(operation=operation or self.operation)

        def _done(f: concurrent.futures.Future) -> None:
            try:
                out.set_result(fn(f.result()))
            except BaseException as exc:  # noqa: BLE001 - forwarded to the caller's result()
                out.set_exception(exc)

        self._future.add_done_callback(_done)
        return out

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<APIFuture {self.operation or ''} {state}>"
