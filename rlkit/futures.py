"""``APIFuture``: the handle every session operation returns at once.

Wraps a :class:`concurrent.futures.Future` with the SDK's surface: ``result(timeout)``,
``await future`` (or ``result_async``), ``done()``, ``exception()``. A backend completes it from
its worker thread; errors raised by the operation are re-raised by ``result()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Callable, Generic, Optional, TypeVar

T = TypeVar("T")
U = TypeVar("U")

DEFAULT_TIMEOUT: Optional[float] = None


class APIFuture(Generic[T]):
    """The pending result of one operation."""

    def __init__(self, future: Optional[concurrent.futures.Future] = None, *, operation: str = ""):
        self._future: concurrent.futures.Future = future or concurrent.futures.Future()
        self.operation = operation

    # -- completion (backend side) -------------------------------------------------------------
    def set_result(self, value: T) -> None:
        self._future.set_result(value)

    def set_exception(self, exc: BaseException) -> None:
        self._future.set_exception(exc)

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
