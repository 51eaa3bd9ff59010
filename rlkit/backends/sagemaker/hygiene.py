"""Session hygiene: every session this process created is stopped when it ends.

A running session holds accelerators (and quota) until it is stopped, so the adapter stops its
sessions on every way out of a loop:

- normal end, or an exception: the loop's ``finally`` (``trainer.stop()``, ``service.close()``)
  and the clients' context managers;
- ``Ctrl-C`` (SIGINT): Python raises ``KeyboardInterrupt``, so the same ``finally`` blocks run;
- ``SIGTERM`` (``kill``, a scheduler's preemption): the adapter installs a handler that raises
  ``SystemExit(143)`` in the main thread, so the ``finally`` blocks run too — only when SIGTERM
  still has its default disposition, so an application's own handler is never replaced;
- interpreter exit with a client still open: an ``atexit`` hook closes every live service client.

``SIGKILL`` cannot be caught: ``rlkit sessions list`` / ``rlkit sessions stop NAME`` clean up
after it (and the service stops idle sessions after its inactivity timeout).
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import weakref
from typing import Any

log = logging.getLogger("rlkit.sagemaker")

_live: "weakref.WeakSet[Any]" = weakref.WeakSet()
_lock = threading.Lock()
_atexit_installed = False
_signals_installed = False


def _close_all() -> None:
    for client in list(_live):
        try:
            client.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            log.warning("could not stop SageMaker sessions at exit", exc_info=True)


def _on_sigterm(signum: int, frame: Any) -> None:
    log.warning("SIGTERM: stopping SageMaker training sessions before exiting")
    raise SystemExit(128 + signum)


def register(client: Any, *, handle_signals: bool = True) -> None:
    """Track ``client`` (a service client with ``close()``) until it closes or the process exits."""
    global _atexit_installed, _signals_installed
    with _lock:
        _live.add(client)
        if not _atexit_installed:
            _atexit_installed = True
            atexit.register(_close_all)
        if handle_signals and not _signals_installed and threading.current_thread() is threading.main_thread():
            _signals_installed = True
            try:
                if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                    signal.signal(signal.SIGTERM, _on_sigterm)
            except (ValueError, OSError):  # not the main interpreter / unsupported platform
                pass


def unregister(client: Any) -> None:
    with _lock:
        _live.discard(client)
