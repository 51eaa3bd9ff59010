"""Field checks for the Tinker server's JSON requests: every value's type and range, at submit.

Each raises a 400 (:func:`~.records.bad_request`) naming the field, so a malformed request never
reaches a training run's queue or a shared decode batch. Types are strict: ``"false"`` is not a
boolean, ``"3"`` and ``3.5`` are not integers, ``True`` is not a number.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional

from rlkit.backends.tinker.server.records import bad_request

MAX_SEED = 2**63 - 1  # the sampler's generators take a signed 64-bit seed; rlkit keeps seeds non-negative
_MISSING = object()


def integer(value: Any, where: str, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{where}: expected an integer, got {_show(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise bad_request(f"{where}={_show(value)} is out of range [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]")
    return value


def optional_integer(value: Any, where: str, lo: Optional[int] = None, hi: Optional[int] = None) -> Optional[int]:
    return None if value is None else integer(value, where, lo, hi)


def number(value: Any, where: str, lo: Optional[float] = None, hi: Optional[float] = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{where}: expected a number, got {_show(value)}")
    out = float(value)
    if not math.isfinite(out) or (lo is not None and out < lo) or (hi is not None and out > hi):
        raise bad_request(f"{where}={_show(value)} is out of range [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]")
    return out


def boolean(value: Any, where: str, default: Optional[bool] = None) -> bool:
    if value is None and default is not None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{where}: expected true or false, got {_show(value)}")
    return value


def text(value: Any, where: str, max_len: int = 4096, optional: bool = False) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{where}: expected a string, got {_show(value)}")
    if len(value) > max_len:
        raise bad_request(f"{where}: {len(value)} characters, over the limit of {max_len}")
    return value


def obj(body: Dict[str, Any], key: str, where: str) -> Dict[str, Any]:
    """``body[key]`` as an object (``{}`` when absent or null)."""
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{where}.{key}: expected an object, got {_show(value)}")
    return value


def field(body: Dict[str, Any], key: str, where: str) -> Any:
    value = body.get(key, _MISSING)
    if value is _MISSING or value is None:
        raise bad_request(f"{where}: missing field {key!r}")
    return value


def metadata(value: Any, where: str, limit: int) -> Optional[Dict[str, Any]]:
    """``user_metadata``: an object of at most ``limit`` bytes as JSON."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"{where}.user_metadata: expected an object, got {_show(value)}")
    size = len(json.dumps(value))
    if size > limit:
        raise bad_request(f"{where}.user_metadata is {size} bytes as JSON, over the server's limit of {limit}")
    return value


def seed(value: Any, where: str) -> Optional[int]:
    return optional_integer(value, where, 0, MAX_SEED)


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    text_ = repr(value)
    return text_ if len(text_) <= 40 else text_[:37] + "..."
