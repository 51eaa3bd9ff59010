"""Running one program in the sandbox: limits, the result record, the parent side of the launcher.

See :mod:`rlkit.sandbox` for what is enforced. :func:`run_program` is the entry point; it checks
once per process (see :mod:`rlkit.sandbox.selfcheck`) that the sandbox really isolates before the
first program runs.
"""

from __future__ import annotations

import json
import math
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from rlkit.errors import BackendUnavailableError, InvalidInputError
from rlkit.lifetime import end_group

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launcher.py")
VERDICTS = ("ok", "runtime_error", "timeout", "memory_limit", "output_limit", "killed",
            "sandbox_error")
MiB = 1 << 20


class SandboxUnavailableError(BackendUnavailableError):
    """The sandbox cannot isolate programs here (no namespaces, network reachable, ...)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed program.

    ``cpu_time_s`` becomes RLIMIT_CPU rounded up to whole seconds (SIGXCPU, then SIGKILL one
    second later); ``wall_time_s`` is enforced by the parent, which kills the whole sandbox.
    ``memory_bytes`` is RLIMIT_AS (per process), ``max_processes`` RLIMIT_NPROC (processes and
    threads of the sandbox's private uid), ``max_file_bytes`` RLIMIT_FSIZE, ``max_open_files``
    RLIMIT_NOFILE; ``max_output_bytes`` caps stdout and stderr each; ``tmpfs_bytes`` caps the
    total size of the work directory.
    """

    cpu_time_s: float = 2.0
    wall_time_s: float = 5.0
    memory_bytes: int = 512 * MiB
    max_processes: int = 32
    max_file_bytes: int = 16 * MiB
    max_open_files: int = 64
    max_output_bytes: int = 1 * MiB
    tmpfs_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise InvalidInputError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
        if self.memory_bytes < 32 * MiB:
            raise InvalidInputError("SandboxLimits.memory_bytes must be at least 32 MiB (Python needs it)")


@dataclass
class ExecutionResult:
    """What happened to one program. ``verdict`` is one of :data:`VERDICTS`."""

    verdict: str
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    wall_time_s: float = 0.0
    cpu_time_s: Optional[float] = None
    truncated: bool = False
    error: Optional[str] = None  # sandbox-side problem (verdict ``sandbox_error``)
    isolation: Optional[str] = None  # "root" | "userns" | "none"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


class _UidAllocator:
    """Hands out private uids (never in /etc/passwd) so concurrent sandboxes never share a
    RLIMIT_NPROC count and cannot signal each other. Random start per process."""

    BASE, SPAN = 2_000_000_000, 100_000_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = random.SystemRandom().randrange(self.SPAN)
        self._busy: set[int] = set()

    def acquire(self) -> int:
        with self._lock:
            while True:
                uid = self.BASE + self._next % self.SPAN
                self._next += 1
                if uid not in self._busy:
                    self._busy.add(uid)
                    return uid

    def release(self, uid: int) -> None:
        with self._lock:
            self._busy.discard(uid)


_uids = _UidAllocator()

CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def execute(
    source: str,
    stdin: Union[str, bytes],
    *,
    limits: SandboxLimits,
    python: str,
    allow_unisolated: bool = False,
    files: Optional[Mapping[str, str]] = None,
) -> ExecutionResult:
    """Run without the self-check (used by the self-check itself). Prefer :func:`run_program`."""
    if not isinstance(source, str):
        raise InvalidInputError(f"run_program: source must be str, got {type(source).__name__}")
    if not isinstance(stdin, (str, bytes)):
        raise InvalidInputError(f"run_program: stdin must be str or bytes, got {type(stdin).__name__}")
    all_files = dict(files or {})
    all_files["main.py"] = source
    for name in all_files:
        if not name or "/" in name or name.startswith("."):
            raise InvalidInputError(f"run_program: bad file name {name!r}")
    uid = _uids.acquire()
    host_workdir = None
    try:
        if allow_unisolated:  # no mount namespace: a host temp dir, removed below
            host_workdir = tempfile.mkdtemp(prefix="rlkit-sandbox-")
        cfg = {
            "python": python, "argv": ["main.py"], "files": all_files, "uid": uid, "gid": uid,
            "env": dict(CHILD_ENV), "wall_s": limits.wall_time_s,
            "tmpfs_bytes": limits.tmpfs_bytes, "allow_unisolated": allow_unisolated,
            "workdir": host_workdir,
            "limits": {"cpu_s": math.ceil(limits.cpu_time_s), "as_bytes": limits.memory_bytes,
                       "nproc": limits.max_processes, "fsize_bytes": limits.max_file_bytes,
                       "nofile": limits.max_open_files},
        }
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        return _supervise(json.dumps(cfg).encode(), data, limits)
    finally:
        _uids.release(uid)
        if host_workdir:
            shutil.rmtree(host_workdir, ignore_errors=True)


def _supervise(cfg: bytes, stdin: bytes, limits: SandboxLimits) -> ExecutionResult:
    """Spawn the launcher, pump stdin/stdout/stderr with caps and a deadline, classify."""
    cfg_r, cfg_w = os.pipe()
    status_r, status_w = os.pipe()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", LAUNCHER, str(cfg_r), str(status_w), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(cfg_r, status_w), env={}, cwd="/", start_new_session=True,
        )
    except OSError as exc:
        for fd in (cfg_r, cfg_w, status_r, status_w):
            os.close(fd)
        return ExecutionResult("sandbox_error", error=f"cannot start launcher: {exc}")
    os.close(cfg_r)
    os.close(status_w)
    reaped = False
    try:
        try:
            with os.fdopen(cfg_w, "wb") as f:
                f.write(cfg)
        except BrokenPipeError:
            pass
        io = _pump(proc, stdin, status_r, start + limits.wall_time_s, limits.max_output_bytes)
        if io["timed_out"] or io["overflow"]:
            _kill(proc)
        _, wait_status, usage = os.wait4(proc.pid, 0)
        reaped = True
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        status_bytes = io["status"] + _drain(status_r)
    finally:
        if not reaped:  # interrupted (e.g. KeyboardInterrupt): never leave the sandbox running
            _kill(proc)
            os.waitpid(proc.pid, 0)
            proc.returncode = -signal.SIGKILL
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        os.close(status_r)
    records = [json.loads(line) for line in status_bytes.decode("utf-8", "replace").splitlines()
               if line.startswith("{")]
    result = _classify(records, io, limits)
    result.wall_time_s = time.monotonic() - start
    if result.cpu_time_s is None:
        result.cpu_time_s = usage.ru_utime + usage.ru_stime
    return result


def _pump(proc: subprocess.Popen, stdin: bytes, status_fd: int, deadline: float,
          cap: int) -> dict:
    out, err, status = bytearray(), bytearray(), bytearray()
    timed_out = overflow = False
    sel = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        sel.register(stream.fileno(), selectors.EVENT_READ)
    sel.register(status_fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    if stdin:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, status_fd: status}
    view, offset = memoryview(stdin), 0
    open_readers = 2
    while open_readers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for key, _ in sel.select(remaining):
            fd = key.fd
            if fd == stdin_fd:
                try:
                    offset += os.write(fd, view[offset:offset + 65536])
                except BlockingIOError:
                    continue
                except OSError:  # EPIPE: the program exited or closed stdin; drop the rest
                    offset = len(view)
                if offset >= len(view):
                    sel.unregister(fd)
                    proc.stdin.close()
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(fd)
                if fd != status_fd:
                    open_readers -= 1
                continue
            sink = sinks[fd]
            sink += chunk
            if fd != status_fd and len(sink) > cap:
                del sink[cap:]
                overflow = True
        if overflow:
            break
    sel.close()
    return {"stdout": bytes(out), "stderr": bytes(err), "status": bytes(status),
            "timed_out": timed_out, "overflow": overflow}


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _kill(proc: subprocess.Popen) -> None:
    """SIGUSR1 asks the launcher to SIGKILL the sandbox's pid 1, which takes the whole PID
    namespace down; if the launcher has not exited within 3 s, SIGKILL its process group.
    The launcher is never reaped here, so its pid (= process group id) cannot be reused."""
    def exited() -> bool:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None

    end_group(proc.pid, exited, sig=signal.SIGUSR1, leader_only=True, grace_s=3.0, interval_s=0.005)


def _classify(records: Sequence[dict], io: dict, limits: SandboxLimits) -> ExecutionResult:
    stdout = io["stdout"].decode("utf-8", "replace")
    stderr = io["stderr"].decode("utf-8", "replace")
    res = ExecutionResult("sandbox_error", stdout=stdout, stderr=stderr, truncated=io["overflow"])
    exit_rec = None
    for rec in records:
        event = rec.get("event")
        if event == "started":
            res.isolation = rec.get("isolation")
        elif event == "mounts":
            res.details.update({k: v for k, v in rec.items() if k != "event"})
        elif event == "error" and res.error is None:
            res.error = f"{rec.get('stage')}: {rec.get('message')}"
        elif event == "exit":
            exit_rec = rec
    if exit_rec is not None:
        res.exit_code, res.signal = exit_rec.get("code"), exit_rec.get("signal")
        res.cpu_time_s = exit_rec.get("cpu_s")
        res.details["maxrss_kb"] = exit_rec.get("maxrss_kb")
    if io["overflow"]:
        res.verdict = "output_limit"
    elif io["timed_out"]:
        res.verdict = "timeout"
    elif res.error is not None or exit_rec is None:
        res.verdict = "sandbox_error"
        res.error = res.error or "launcher exited without reporting the program's status"
    elif res.signal is not None:
        cpu = res.cpu_time_s or 0.0
        if res.signal == signal.SIGXCPU or (res.signal == signal.SIGKILL
                                            and cpu >= math.ceil(limits.cpu_time_s)):
            res.verdict = "timeout"
        elif _memory_error(stderr):
            res.verdict = "memory_limit"
        elif res.signal == signal.SIGKILL:
            res.verdict = "killed"
        else:
            res.verdict = "runtime_error"
    elif res.exit_code == 0:
        res.verdict = "ok"
    else:
        res.verdict = "memory_limit" if _memory_error(stderr) else "runtime_error"
    return res


def _memory_error(stderr: str) -> bool:
    tail = stderr.strip().splitlines()[-3:]
    return any("MemoryError" in line or "Cannot allocate memory" in line for line in tail)
