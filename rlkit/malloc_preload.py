"""The ``rlkit`` command runs on mimalloc, preloaded (``RLKIT_ALLOCATOR``).

PyTorch's CPU tensors come from ``malloc``. glibc's ``malloc`` keeps a training step's freed
activations in a heap that fragments: measured on one GSM8K-shaped RL ``forward_backward`` of
SmolLM2-135M (``benchmarks/train_memory.py``, 64 datums, fp32, every layer checkpointed), glibc's
heap grew to 2.9 GiB while never more than 0.54 GiB of it was in use at once (``mallinfo2``), and
the process peaked at 4.2 GiB. A size-class allocator reuses that memory: on mimalloc (Leijen et
al., "Mimalloc: Free List Sharding in Action", 2019) the same step peaked at 2.19 GiB in 41.6 s
against glibc's 3.57 GiB in 50.5 s, and without checkpointing at 4.14 GiB in 31.7 s against
5.19 GiB in 39.1 s (HF + PEFT: 8.38 GiB in 79.1 s; ``benchmarks/README.md``). Intel's and PyTorch's own CPU launchers (``torch.backends.xeon.run_cpu
--enable-jemalloc``) preload an allocator for the same reason.

A process cannot swap its ``malloc`` once it runs, so :func:`reexec_on_allocator` (called by
:func:`rlkit.cli.main` when it is the process's entry point) re-executes the same command once, at
start, with the library in ``LD_PRELOAD`` — the same process id, arguments and exit code. mimalloc
runs with ``MIMALLOC_PURGE_DELAY=-1`` (freed pages are kept for reuse, not returned: with its
default purging the same step ran 1.37x slower than on glibc; your own setting wins). The
re-executed process puts ``LD_PRELOAD`` (and that setting) back as they were, so the programs it starts (sandboxed
model-written code, vLLM servers, shells) run on their usual allocator; ``rlkit train``
subprocesses preload again themselves.

``RLKIT_ALLOCATOR``:

- ``auto`` (default): mimalloc from the ``cmeel-mimalloc`` wheel (an rlkit dependency on Linux)
  where it is installed, else the system's ``malloc``;
- ``mimalloc``, ``jemalloc``, ``tcmalloc``: that library (jemalloc and tcmalloc are found the way
  the dynamic loader finds ``libjemalloc.so.2`` / ``libtcmalloc_minimal.so.4``, e.g. Debian's
  ``libjemalloc2``); asked for and missing is one line, exit 2;
- ``system`` (or ``glibc``): no preload;
- a path to a shared library: that one.

**A script of your own** (``python my_loop.py``, ``python -m my_pkg.loop``) gets the same at
``import rlkit`` (:func:`reexec_for_script`, called by ``rlkit/__init__.py`` first thing): when the
import is made by the script's own top-level code, the script is re-executed once, the same way,
before anything else of rlkit (or torch, if imported after rlkit) loads — so code that ran before
``import rlkit`` runs twice: import rlkit first, or set ``RLKIT_ALLOCATOR=system``. Nothing is
re-executed for ``python -c``, standard input, an interactive or IPython/Jupyter session, or an
import made by a library rather than the script (a test runner, a launcher's worker). It is also
what ``rlkit run my_loop.py`` (:mod:`rlkit.run_script`) and the preload by hand
(``MIMALLOC_PURGE_DELAY=-1 LD_PRELOAD=$(python -m rlkit.malloc_preload) python my_loop.py``) give.
Linux only; elsewhere every choice but ``system`` is ignored with nothing preloaded.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import json
import logging
import os
import sys
from pathlib import Path
from typing import Dict, Mapping, Optional

from rlkit.errors import ConfigError

log = logging.getLogger(__name__)

ENV = "RLKIT_ALLOCATOR"
PRELOADED = "_RLKIT_PRELOADED"  # set for the re-executed process: the library it was started with
BEFORE = "_RLKIT_ENV_BEFORE"  # the variables the re-exec set, as the user had them (JSON; restored after it)
#: mimalloc's settings for a training process (read once, at its start): never purge freed pages. Measured with
#: mimalloc's default purging, the step above took 1.37x glibc's time (pages decommitted, then faulted back
#: in); without it, 0.81x glibc's time at 0.80x its peak (benchmarks/README.md).
MIMALLOC_SETTINGS = {"MIMALLOC_PURGE_DELAY": "-1"}
SYSTEM = ("system", "glibc", "none", "off")
KNOWN = {"jemalloc": "jemalloc", "tcmalloc": "tcmalloc_minimal"}  # name -> the library's stem (libSTEM.so)


def bundled_mimalloc() -> Optional[str]:
    """The path of ``libmimalloc.so`` from the installed ``cmeel-mimalloc`` wheel, or ``None``."""
    try:
        dist = importlib.metadata.distribution("cmeel-mimalloc")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name.startswith("libmimalloc.so"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return str(path)
    return None


def library(choice: Optional[str] = None) -> Optional[str]:
    """The library ``choice`` (default: ``$RLKIT_ALLOCATOR``, else ``auto``) preloads, or ``None``
    for the system's ``malloc``; a named allocator that is not installed is a :class:`ConfigError`."""
    choice = (choice if choice is not None else os.environ.get(ENV, "auto")).strip()
    name = choice.lower()
    if name in SYSTEM or not sys.platform.startswith("linux"):
        return None
    if name in ("auto", ""):
        return bundled_mimalloc()
    if name == "mimalloc":
        found = bundled_mimalloc() or ctypes.util.find_library("mimalloc")
    elif name in KNOWN:
        found = ctypes.util.find_library(KNOWN[name])
    elif "/" in choice:
        found = choice if Path(choice).is_file() else None
    else:
        raise ConfigError(f"{ENV}={choice!r}: expected auto, mimalloc, jemalloc, tcmalloc, system or a library's path")
    if not found:
        hint = {"mimalloc": "pip install cmeel-mimalloc", "jemalloc": "apt-get install libjemalloc2",
                "tcmalloc": "apt-get install libtcmalloc-minimal4"}.get(name, "no such file")
        raise ConfigError(f"{ENV}={choice!r}: not found ({hint}); {ENV}=system runs on the system's malloc")
    return found


def mapped(lib: str) -> bool:
    """Whether ``lib`` (a path or a file name) is loaded in this process (``/proc/self/maps``)."""
    name = Path(lib).name.split(".so")[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return any(Path(line.split()[-1]).name.startswith(name + ".so") for line in maps.splitlines() if "/" in line)


def active() -> str:
    """Which allocator serves this process's ``malloc``: ``mimalloc``, ``jemalloc``, ``tcmalloc`` or
    ``system`` (for reports: benchmark and repro machine lines)."""
    for name, lib in (("mimalloc", "libmimalloc.so"), *((n, f"lib{stem}.so") for n, stem in KNOWN.items())):
        if mapped(lib):
            return name
    return "system"


def preloaded_env(lib: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """``environ`` for a process started with ``lib`` preloaded: ``LD_PRELOAD`` (the user's own kept
    after it), mimalloc's settings where the user set none, and the markers with which the started
    process restores the variables for its children (:func:`reexec_on_allocator`)."""
    before = environ.get("LD_PRELOAD", "")
    settings = {"LD_PRELOAD": f"{lib}:{before}" if before else lib}
    if "mimalloc" in Path(lib).name:
        settings.update({k: v for k, v in MIMALLOC_SETTINGS.items() if k not in environ})  # the user's own win
    return dict(environ, **settings, **{PRELOADED: lib, BEFORE: json.dumps({k: environ.get(k) for k in settings})})


def reexec_on_allocator() -> None:
    """Re-execute this process once with the chosen allocator preloaded (see the module docstring);
    in the re-executed process, restore the variables it set (``LD_PRELOAD``, mimalloc's settings) for
    its children. Returns when nothing is to
    be done; a named allocator that is missing raises :class:`ConfigError` before anything runs."""
    if PRELOADED in os.environ:  # we are the re-executed process
        lib = os.environ.pop(PRELOADED)
        for name, value in json.loads(os.environ.pop(BEFORE, "{}")).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if not mapped(lib):  # the dynamic loader refused it (it printed why): carry on with malloc as it is
            log.warning("%s: %s could not be preloaded; running on the system's malloc", ENV, lib)
        return
    lib = library()
    if lib is None or mapped(lib):
        return
    argv = list(getattr(sys, "orig_argv", ()) or ())
    if not argv or not sys.executable:
        return
    env = preloaded_env(lib, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:  # could not re-execute: go on as we are
        log.warning("%s: could not re-execute with %s preloaded (%s); running on the system's malloc", ENV, lib, exc)


def _imported_by_main_script() -> bool:
    """Whether the import of rlkit under way was made by the top-level code of a script run as
    ``python FILE`` or ``python -m MODULE`` (not ``-c``, standard input, an interactive session, or a
    library importing rlkit on the script's behalf)."""
    if sys.flags.interactive or "IPython" in sys.modules or not sys.argv or not os.path.isfile(sys.argv[0]):
        return False
    frame = sys._getframe(1)
    here = str(Path(__file__).resolve().parent)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen importlib") or name.startswith(here)):
            return frame.f_globals.get("__name__") == "__main__" and frame.f_code.co_name == "<module>"
        frame = frame.f_back
    return False


def _starting_the_rlkit_command() -> bool:
    """Whether this import of rlkit is ``python -m rlkit ...`` locating its ``__main__``: Python
    imports the package first, with ``sys.argv[0] == "-m"`` until the module is found."""
    if not sys.argv or sys.argv[0] != "-m":
        return False
    argv = list(getattr(sys, "orig_argv", ()) or ())
    return "-mrlkit" in argv or any(a == "-m" and b == "rlkit" for a, b in zip(argv, argv[1:]))


def reexec_for_script() -> None:
    """At ``import rlkit``: in a process this module re-executed, restore the variables it set; in a
    script that imports rlkit from its own top-level code, or ``python -m rlkit`` (the command, re-executed
    here before the rest of rlkit loads, not after: 0.1-0.3 s a command), re-execute it once on the
    allocator (see the module docstring). Never raises: a missing named allocator is said by the
    ``rlkit`` command (:func:`rlkit.cli.main` asks again); a script goes on with the system's ``malloc``."""
    preloaded = PRELOADED in os.environ
    command = not preloaded and _starting_the_rlkit_command()
    if not (preloaded or command or _imported_by_main_script()):
        return
    try:
        reexec_on_allocator()
    except ConfigError as exc:
        if not command:
            log.warning("%s", exc)


def main() -> int:
    """``python -m rlkit.malloc_preload``: print the library ``RLKIT_ALLOCATOR`` chooses (empty for
    the system's malloc), for ``MIMALLOC_PURGE_DELAY=-1 LD_PRELOAD=$(python -m rlkit.malloc_preload) python my_loop.py``."""
    try:
        print(library() or "")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
