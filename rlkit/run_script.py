"""``rlkit run SCRIPT.py [ARGS ...]`` / ``rlkit run -m MODULE [ARGS ...]``: your own loop, as
``python SCRIPT.py ARGS`` would run it, under what the ``rlkit`` command gives its own loops.

A loop a user writes (``rlkit.connect``, ``forward_backward``, ``optim_step``, ...) is a plain
Python script, so ``python my_loop.py`` starts it on the system's ``malloc`` and Python's default
Ctrl-C. Started as ``rlkit run my_loop.py`` it runs, in the same process, on the allocator
:mod:`rlkit.malloc_preload` chooses (mimalloc on Linux: one RL step of SmolLM2-135M, measured,
peaked at 0.80x glibc's memory in 0.81x its time) and with :mod:`rlkit.interrupts`' Ctrl-C policy (first:
``KeyboardInterrupt``, your ``finally`` blocks run; second: queued local operations cancelled;
third: exit at once) — the launcher pattern of ``torchrun`` and ``accelerate launch``.

The script sees what ``python`` would give it: ``__name__ == "__main__"``, ``sys.argv`` = the
script and its arguments, its own directory first on ``sys.path`` (for ``-m``: the current
directory), and its ``sys.exit`` code as the command's. An exception it does not catch prints its
traceback and exits 1, as under ``python``; an :class:`~rlkit.errors.RlkitError` (a bad config or
request) is one line and exit 2, as for every ``rlkit`` command.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Callable, List, Optional

from rlkit.errors import ConfigError, RlkitError

USAGE = """usage: rlkit run SCRIPT.py [ARGS ...]
       rlkit run -m MODULE [ARGS ...]

Run your own training loop as `python SCRIPT.py ARGS` would, on rlkit's allocator
(RLKIT_ALLOCATOR: mimalloc by default on Linux) and Ctrl-C policy (first: KeyboardInterrupt, second:
cancel queued operations, third: quit at once). Exit code: the script's own."""


def run_command(argv: List[str]) -> Optional[int]:
    """``rlkit run``: check the target, then run it as ``__main__`` in this process."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ConfigError("run -m: expected a module name (rlkit run -m MODULE [ARGS ...])")
        module, args = argv[1], argv[2:]
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise ConfigError(f"run -m {module}: no module named {module!r} (from {os.getcwd()})")
        sys.argv = [found.origin or module, *args]
        return _as_main(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    script, args = Path(argv[0]), argv[1:]
    if argv[0].startswith("-"):
        raise ConfigError(f"run: unknown option {argv[0]!r} (rlkit run SCRIPT.py [ARGS ...] or rlkit run -m MODULE)")
    if script.is_dir() and not (script / "__main__.py").is_file():
        raise ConfigError(f"run: {str(script)!r} is a directory without a __main__.py")
    if not script.exists():
        raise ConfigError(f"run: no such file {str(script)!r}")
    sys.argv = [str(script), *args]
    if script.is_file():  # (run_path puts a directory on sys.path itself)
        sys.path.insert(0, str(script.resolve().parent))
    return _as_main(lambda: runpy.run_path(str(script), run_name="__main__"))


def _as_main(run: Callable[[], object]) -> int:
    """Run the target; an exception it does not catch prints its traceback from the target's own
    frames on (as ``python`` shows it) and returns 1. ``SystemExit``, ``KeyboardInterrupt`` and
    :class:`~rlkit.errors.RlkitError` go on to the ``rlkit`` command, which answers them."""
    try:
        run()
    except (SystemExit, KeyboardInterrupt, RlkitError):
        raise
    except BaseException as exc:  # noqa: BLE001 - the user's code: shown as python would show it
        from rlkit.backends.local.ranks_launch import record_exception

        if record_exception(exc):  # a rank under torch's elastic agent: its error file; rlkit's launcher says it
            return 1
        tb = exc.__traceback__
        while tb is not None and _launcher_frame(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        return 1
    return 0


def _launcher_frame(filename: str) -> bool:
    return filename in (__file__, runpy.__file__) or "runpy" in filename and filename.startswith("<frozen")
