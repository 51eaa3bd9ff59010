"""What every part of the Tinker server passes around: a refused request (:class:`TinkerError`),
an operation's :class:`Future`, a request's content digest, and the wire's time and error formats.
Below the server's state and its runs, which both use them."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional


class TinkerError(Exception):
    """A request the server refuses: HTTP ``status`` with a one-line ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


_RENUMBERED = ("sampling_session_seq_id",)


def digest(body: Any) -> str:
    """What identifies a request's content, to tell a resubmission from a different request
    reusing its id: the bytes of a protobuf body, the canonical JSON of a JSON one."""
    if isinstance(body, dict):  # the SDK itself renumbers a sampler it asks for again on a retry
        body = {k: v for k, v in body.items() if k not in _RENUMBERED}
    data = body if isinstance(body, bytes) else json.dumps(body, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def not_found(message: str) -> TinkerError:
    return TinkerError(404, message)


def bad_request(message: str) -> TinkerError:
    return TinkerError(400, message)


@dataclass
class Future:
    """One operation's result: protobuf bytes or a JSON object, or an error."""

    request_id: str
    done: threading.Event = field(default_factory=threading.Event)
    payload: Any = None  # bytes (protobuf) or a dict (JSON)
    error: Optional[str] = None
    category: str = "user"
    owner: Optional[str] = None

    def finish(self, payload: Any = None, error: Optional[str] = None, category: str = "user") -> None:
        if not self.done.is_set():
            self.payload, self.error, self.category = payload, error, category
            self.done.set()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:2000]
