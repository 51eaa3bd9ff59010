"""Serving rlkit models over OpenAI's chat-completions API, and checking such endpoints.

- :func:`create_app` / :func:`start_server` (needs the ``serve`` extra): a FastAPI app for a
  :class:`ModelSource` — :class:`FixedModel` (a base model or checkpoint; ``update()`` swaps in a
  live session's new weights) or :class:`RunFollower` (a run directory's newest checkpoint).
- :func:`check_endpoint`: probe which parameters any OpenAI-compatible endpoint honours.

The CLI is ``rlkit serve`` and ``rlkit endpoint check`` (:mod:`rlkit.serve.cli`); see docs/serve.md.
"""

from __future__ import annotations

from typing import Any

from rlkit.serve.protocol import APIError, Limits
from rlkit.serve.sources import FixedModel, ModelSource, RunFollower, Snapshot

__all__ = ["APIError", "FixedModel", "Limits", "ModelSource", "RunFollower", "Snapshot", "check_endpoint", "create_app", "start_server"]


def create_app(*args: Any, **kwargs: Any) -> Any:
    from rlkit.serve.app import create_app as _create_app

    return _create_app(*args, **kwargs)


def start_server(*args: Any, **kwargs: Any) -> Any:
    from rlkit.serve.app import start_server as _start_server

    return _start_server(*args, **kwargs)


def check_endpoint(*args: Any, **kwargs: Any) -> Any:
    from rlkit.serve.checker import check_endpoint as _check

    return _check(*args, **kwargs)
