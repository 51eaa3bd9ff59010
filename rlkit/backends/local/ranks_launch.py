"""``rlkit train ... backend.nproc=N``: torch's elastic agent in this process, and a failed rank in one line.

**Launching.** :func:`launch` runs ``rlkit ARGV`` on N ranks of this node with
``torch.distributed.launcher.api.elastic_launch`` configured as ``torchrun --standalone`` is (a c10d
rendezvous on a free local port, no restarts, ``OMP_NUM_THREADS=1`` unless set). As under
``torchrun``, Ctrl-C (or SIGTERM) to the launcher is passed on by the agent to every rank (which
stop as :mod:`rlkit.interrupts` says; SIGKILL after 30 s), then one line, exit 128 + the signal.
Unlike ``torchrun``, a failure is one line instead of its report. Unlike ``torchrun``'s, these ranks
die with the launcher however it ends (``kill -9`` included: :func:`rlkit.lifetime.die_with_launcher`),
so a killed run's directory is free to resume at once.

**A failed rank.** When a rank dies (a signal: ``kill -9``, the kernel's OOM killer), raises, or
stops with an rlkit error line, the agent stops every other rank (SIGTERM, then SIGKILL) and
:func:`failure_line` turns its ``ChildFailedError.failures`` into one line::

    rlkit: error: rank 1 (pid 1234) was killed by SIGKILL (...); the run's last checkpoint is step 3: resume it with: rlkit train resume=DIR
    rlkit: error: rank 1 (pid 1234) raised ValueError: ... (traceback: FILE); ...

The cause is the rank killed by a signal, else the rank whose error is not a broken connection to
a peer (the collateral of another rank's death), else the earliest. **Exit code**: ``128 + the
signal`` for a rank killed by a signal (137 for SIGKILL), else the failing rank's own (2 for an
rlkit error line, 1 for an exception).

**The ranks' side** (:func:`record_line`, :func:`record_exception`): a rank under an elastic
agent (``TORCHELASTIC_ERROR_FILE`` set: ``torchrun`` or :func:`launch`) writes its error to
torch's error file in the format of ``torch.distributed.elastic.multiprocessing.errors``
(``@record``), so torchrun's own report shows the line too; under :func:`launch`
(``RLKIT_LAUNCHED_RANKS`` set) the rank prints nothing itself and the launcher's line is the one
the user sees. Nothing here imports torch at module level: ``rlkit.cli.fail`` imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import traceback
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from rlkit.lifetime import LAUNCHER_PID, launcher_env

#: set in the ranks :func:`launch` starts: their failures are said by the launcher, not by each rank
LAUNCHED = "RLKIT_LAUNCHED_RANKS"
#: a rank's recorded rlkit error line starts with this (an exception's starts with its type name)
LINE_PREFIX = "rlkit: error: "
#: what a rank whose peer died raises in its pending collective (gloo / NCCL): a consequence, not a cause
_COLLATERAL = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
               "nccl communicator was aborted", "connection refused")


def _error_file() -> Optional[str]:
    return os.environ.get("TORCHELASTIC_ERROR_FILE") or None


def launched() -> bool:
    """Whether this process is a rank :func:`launch` started (which then reports its failure)."""
    return os.environ.get(LAUNCHED) == "1" and _error_file() is not None


def _write(message: str, callstack: str) -> None:
    path = _error_file()
    if path is None:
        return
    data = {"message": {"message": message, "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except OSError:  # the error file is a courtesy: the rank's exit code still says it failed
        pass


def record_line(line: str) -> bool:
    """Record an rlkit error line (the text after ``rlkit: error:``) in this rank's error file;
    return whether the launcher reports it (then the rank prints nothing itself)."""
    _write(LINE_PREFIX + line, "")
    return launched()


def record_exception(exc: BaseException) -> bool:
    """Record an exception as ``@record`` does (type, message, traceback) in this rank's error file;
    return whether the launcher reports it (then the rank prints no traceback itself)."""
    if _error_file() is None:
        return False
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    try:
        get_error_handler().record_exception(exc)
    except OSError:
        _write(f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return launched()


def launch(nproc: int, argv: Sequence[str], resume_hint: Optional[Callable[[], str]] = None) -> int:
    """``rlkit ARGV`` on ``nproc`` ranks of this node under torch's elastic agent; 0, or the failed
    rank's exit code after one line naming it and the cause (see the module docstring).
    ``resume_hint()``: what the line adds about the run the ranks trained (its last checkpoint and
    the command resuming it; the caller knows the run's records, the engine does not)."""
    import logging
    import tempfile
    import uuid

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default on N ranks
    os.environ[LAUNCHED] = "1"
    os.environ.update(launcher_env())  # every rank dies with this process, however it ends (rlkit.lifetime)
    if "LOGLEVEL" not in os.environ:  # the agent's own warnings and report: the one line below says it
        for name in list(logging.root.manager.loggerDict):
            if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    log_dir = tempfile.mkdtemp(prefix="rlkit-ranks-")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1,
                          logs_specs=DefaultLogsSpecs(log_dir=log_dir))
    try:
        elastic_launch(config, sys.executable)("-u", "-m", "rlkit", *argv)
    except SignalException as exc:  # Ctrl-C / SIGTERM here: the agent passed it on to every rank and waited
        sys.stderr.write(LINE_PREFIX + f"interrupted ({signal.Signals(exc.sigval).name}); every rank was stopped"
                         + (resume_hint() if resume_hint else "") + "\n")
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        line, code = failure_line(exc.failures, resume_hint)
        sys.stderr.write(LINE_PREFIX + line + "\n")
        sys.stderr.flush()
        return code
    finally:
        os.environ.pop(LAUNCHED, None)
        os.environ.pop(LAUNCHER_PID, None)
    shutil.rmtree(log_dir, ignore_errors=True)  # kept after a failure: the line may name a traceback there
    return 0


def _message(failure: Any) -> str:
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    return " ".join(str(message or "").split())


def _collateral(failure: Any) -> bool:
    text = _message(failure).lower()
    return text.startswith("distbackenderror") or any(c in text for c in _COLLATERAL)


def _rank_of_cause(failure: Any) -> int:
    if failure.exitcode == -signal.SIGTERM:
        return 3  # how the agent stops the ranks still running once one failed
    if failure.exitcode < 0:
        return 0  # killed from outside: kill -9, the OOM killer
    return 2 if _collateral(failure) else 1


def cause(failures: Dict[int, Any]) -> Tuple[int, Any]:
    """The failure that caused the others: a rank killed by a signal other than SIGTERM (which the
    agent sends to the ranks still running once one failed), else one that raised or exited with
    an error other than a broken connection to a peer (the collateral of another rank's death),
    else the earliest (then the lowest rank)."""
    return min(failures.items(), key=lambda kv: (_rank_of_cause(kv[1]), kv[1].timestamp, kv[0]))


def failure_line(failures: Dict[int, Any], resume_hint: Optional[Callable[[], str]] = None) -> Tuple[str, int]:
    """One line (without the ``rlkit: error:`` prefix) naming the failed rank and the cause, and the
    exit code: ``128 + signal`` for a rank killed by a signal, else the rank's own (non-zero)."""
    rank, failure = cause(failures)
    who = f"rank {rank} (pid {failure.pid})"
    message = _message(failure)
    if failure.exitcode < 0:
        name = failure.signal_name()
        what = f"{who} was killed by {name}"
        if name == "SIGKILL":
            what += " (kill -9, or the kernel's OOM killer when memory runs out: see dmesg)"
        code = 128 - failure.exitcode
    elif message.startswith(LINE_PREFIX):
        what, code = f"{who}: {message[len(LINE_PREFIX):]}", failure.exitcode or 1
    elif message and failure.error_file_data.get("message"):
        what, code = f"{who} raised {message}", failure.exitcode or 1
        if "timed out" in message.lower():
            what = (f"{who} timed out waiting for the other ranks in a collective (backend.rank_timeout_s): another rank "
                    f"hung, or is far slower ({message})")
        if failure.error_file and os.path.isfile(failure.error_file):
            what += f" (traceback: {failure.error_file})"
    else:
        what, code = f"{who} exited with code {failure.exitcode}", failure.exitcode or 1
    return what + (resume_hint() if resume_hint else ""), code

