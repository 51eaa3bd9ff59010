"""Tinker, both ways.

- :mod:`.server`: a Tinker-compatible server over the local engine (``rlkit serve tinker``), so
  the official ``tinker`` SDK and tinker-cookbook run unchanged on your own machine;
- ``rlkit.connect("tinker", api_key=..., base_url=...)``: rlkit's session API over the official
  SDK, against Thinking Machines' service or that server.

The SDK is an optional extra (``pip install 'rlkit[tinker]'``); importing this package does not
import it.
"""

from typing import Any


def connect(**options: Any):
    """``rlkit.connect("tinker", api_key=..., base_url=...)``: a :class:`~.adapter.TinkerServiceClient`."""
    from rlkit.backends.tinker.adapter import TinkerServiceClient

    return TinkerServiceClient(**options)


__all__ = ["connect"]
