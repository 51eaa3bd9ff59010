"""How the ``rlkit`` command answers Ctrl-C: stop cleanly, then faster, then at once.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be, including the first
line of a ``Condition.__exit__`` that was about to release a lock; a worker thread then waits for
that lock forever and the process hangs at exit (a second Ctrl-C landing while the first one
unwinds does exactly this). So the command (:func:`install`, called by :func:`rlkit.cli.main` when
it is the process's entry point) raises ``KeyboardInterrupt`` for the *first* SIGINT only:

1. first Ctrl-C: ``KeyboardInterrupt``; the loop's cleanup runs (queued operations finish, the
   checkpoint being written completes, sessions stop), then ``rlkit: error: interrupted``, exit 130;
2. second: no exception; queued operations of the local backend are cancelled (the running one
   finishes) and a note says so;
3. third: ``rlkit: error: interrupted`` and exit 130 at once (``os._exit``: checkpoints are written
   atomically, so none is left half-written; a remote session still running is listed by
   ``rlkit sessions list``).

An application that installed its own SIGINT handler keeps it; library use (``import rlkit``) is
never affected.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

_count = 0


def say(line: str) -> None:
    """Write one line to stderr now; never raise (stderr may be closed at exit)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - stderr may be gone
        pass


def flush_streams() -> None:
    """Flush stdout and stderr before an ``os._exit``; never raise."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _on_sigint(signum: int, frame: Any) -> None:
    global _count
    _count += 1
    if _count == 1:
        raise KeyboardInterrupt
    if _count == 2:
        workers = sys.modules.get("rlkit.backends.local.workers")
        if workers is not None:
            workers.abandon_queued()
        say("rlkit: interrupted again: queued operations cancelled, waiting for the running one "
             "(Ctrl-C again to quit now)")
        return
    flush_streams()
    say("rlkit: error: interrupted")
    os._exit(130)


def install() -> bool:
    """Use this policy for SIGINT if SIGINT still has Python's default handler (and this is the
    main thread); return whether it was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    signal.signal(signal.SIGINT, _on_sigint)
    return True
