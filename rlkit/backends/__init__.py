"""Backends: ``connect(name, **options) -> ServiceClient``.

``local`` is the embedded PyTorch engine; ``sagemaker`` goes through the official
``sagemaker-train`` SDK (``pip install 'rlkit[sagemaker]'``), ``tinker`` through the official
``tinker`` SDK (``pip install 'rlkit[tinker]'``). A backend module exposes
``connect(**options)``; register third-party ones with :func:`register_backend`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

from rlkit.errors import ConfigError
from rlkit.session import ServiceClient

_BACKENDS: Dict[str, str | Callable[..., ServiceClient]] = {
    "local": "rlkit.backends.local:connect",
    "sagemaker": "rlkit.backends.sagemaker:connect",
    "tinker": "rlkit.backends.tinker:connect",
}


def register_backend(name: str, factory: str | Callable[..., ServiceClient]) -> None:
    """Make ``connect(name)`` call ``factory`` (a callable or ``"module:function"``)."""
    _BACKENDS[name] = factory


def connect(backend: str = "local", **options: Any) -> ServiceClient:
    """Open a :class:`~rlkit.session.ServiceClient` on ``backend`` (``"local"`` by default)."""
    factory = _BACKENDS.get(backend)
    if factory is None:
        raise ConfigError(f"unknown backend {backend!r}; available: {', '.join(sorted(_BACKENDS))}")
    if isinstance(factory, str):
        module_name, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
    return factory(**options)
