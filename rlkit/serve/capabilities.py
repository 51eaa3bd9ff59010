"""What a sampling client offers beyond the session protocol, asked in one place: its context
window (the local backend tells it) and whether ``sample`` streams tokens (``on_token``)."""

from __future__ import annotations

import inspect
from typing import Any, Optional


def context_window(client: Any) -> Optional[int]:
    """The model's context length, where the client tells it (``None``: let the sampler cap)."""
    value = getattr(client, "context_window", None)
    return int(value) if value else None


def accepts_on_token(client: Any) -> bool:
    """Whether ``client.sample`` takes an ``on_token`` listener."""
    try:
        return "on_token" in inspect.signature(client.sample).parameters
    except (TypeError, ValueError):
        return False
