"""Request bodies in memory: :class:`BadRequestBody`, :func:`decompress`, and the process's one
budget of body bytes (:class:`BodyBudget`, :data:`BODY_BUDGET`, :class:`BodyHold`), shared by every
rlkit server (the Tinker and SageMaker stand-ins through :mod:`rlkit.backends.http_service`, and
``rlkit serve``'s app). See :mod:`rlkit.backends.http_service` for what a request gets."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import zlib
from typing import Optional

from rlkit.errors import ConfigError

class BadRequestBody(ValueError):
    """A body that cannot be a request: its HTTP ``status`` (400, 413, 415; 503 when the budget is full) and a one-line message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status



BODY_BUDGET_ENV = "RLKIT_BODY_BUDGET_BYTES"
DECOMPRESS_CHUNK = 1 << 20  # a decompression takes its budget a MiB of output at a time


class BodyBudget:
    """The bytes of request bodies this process holds at once, over every request of every server
    in it: a counter with a ceiling (``total``). A request takes bytes before it holds them and
    gives them all back when it ends (:class:`BodyHold`); one that does not fit waits up to
    ``wait_s`` for others to give back, then is refused (503)."""

    def __init__(self, total: int, wait_s: float = 5.0):
        if total <= 0:
            raise ValueError(f"{BODY_BUDGET_ENV}: expected a positive number of bytes, got {total}")
        self.total, self.wait_s = int(total), float(wait_s)
        self.held = self.peak = 0
        self._cond = threading.Condition()

    def _fits(self, n: int) -> bool:
        if self.held + n > self.total:
            return False
        self.held += n
        self.peak = max(self.peak, self.held)
        return True

    def take(self, n: int) -> bool:
        """Take ``n`` bytes, waiting up to :attr:`wait_s` (a worker thread); False if they never fit."""
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while not self._fits(n):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    async def take_async(self, n: int) -> bool:
        """:meth:`take` on an event loop (polls: the loop is never blocked)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._cond:
                if self._fits(n):
                    return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)

    def give(self, n: int) -> None:
        with self._cond:
            self.held -= n
            self._cond.notify_all()

    def refusal(self, n: int) -> "BadRequestBody":
        return BadRequestBody(f"the server holds its limit of {self.total} bytes of request bodies ({BODY_BUDGET_ENV}) "
                              f"and {n} more did not fit within {self.wait_s:g} s; retry shortly", 503)


def _budget_from_env() -> BodyBudget:
    raw = os.environ.get(BODY_BUDGET_ENV, "").strip()
    try:
        return BodyBudget(int(raw) if raw else 1 << 30)
    except ValueError:
        raise ConfigError(f"{BODY_BUDGET_ENV}={raw!r}: expected a positive number of bytes") from None


BODY_BUDGET = _budget_from_env()  # the process's one budget (rlkit serve's app uses it too)


class BodyHold:
    """One request's share of :data:`BODY_BUDGET`: grows as its body is read or decompressed, and
    is given back whole by :meth:`release` when the request ends. Growing past what the budget can
    give within its wait is :class:`BadRequestBody` 503."""

    def __init__(self, budget: Optional[BodyBudget] = None):
        self.budget = budget or BODY_BUDGET
        self.bytes = 0

    def grow(self, n: int) -> None:
        if n > 0:
            if not self.budget.take(n):
                raise self.budget.refusal(n)
            self.bytes += n

    async def grow_async(self, n: int) -> None:
        if n > 0:
            if not await self.budget.take_async(n):
                raise self.budget.refusal(n)
            self.bytes += n

    def shrink(self, n: int) -> None:
        n = min(n, self.bytes)
        self.bytes -= n
        self.budget.give(n)

    def release(self) -> None:
        self.shrink(self.bytes)


def decompress(body: bytes, encoding: str, limit: int, hold: Optional[BodyHold] = None) -> bytes:
    """``body`` decoded from ``Content-Encoding: encoding``, refused (413) past ``limit`` bytes of
    output. Output comes a MiB at a time, each taken from ``hold`` first (and the joined copy too,
    while the pieces live), so a bomb holds no more than its request may."""
    encoding = encoding.strip().lower()
    hold = hold or BodyHold()
    parts: list = []
    size = 0

    def add(piece: bytes) -> None:
        nonlocal size
        size += len(piece)
        if size > limit:
            raise BadRequestBody(f"the request body decompresses to more than the {limit}-byte limit", 413)
        hold.grow(len(piece))
        parts.append(piece)

    try:
        if encoding == "zstd":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
            while True:
                piece = reader.read(DECOMPRESS_CHUNK)
                if not piece:
                    break
                add(piece)
        elif encoding in ("gzip", "x-gzip", "deflate"):
            d = zlib.decompressobj(wbits=47 if encoding != "deflate" else 15)
            data = body
            while not d.eof:
                piece = d.decompress(data, DECOMPRESS_CHUNK)
                data = d.unconsumed_tail
                if piece:
                    add(piece)
                elif not data:  # input ended before the stream did
                    break
        else:
            raise BadRequestBody(f"Content-Encoding {encoding!r} is not supported (gzip, deflate or zstd)", 415)
    except BadRequestBody:
        raise
    except Exception:  # noqa: BLE001 - zstd / zlib errors: a corrupt body is the client's
        raise BadRequestBody(f"the request body is not valid {encoding} data") from None
    hold.grow(size)  # the joined copy, while the pieces still live
    out = b"".join(parts)
    parts.clear()
    hold.shrink(size)
    return out
