"""Children die with rlkit: the one rule for every process rlkit starts.

A process rlkit starts ends when rlkit ends, however rlkit ends — a normal exit, an exception, a
``kill -9``. Two mechanisms, one rule:

- :func:`spawn` (vLLM servers, ``rlkit repro``'s runs, anything started from a command line) starts
  the program under a small **watchdog** (this file run as a script, ``python -I -S``): the
  watchdog holds the read end of a pipe whose only writer is rlkit; when rlkit dies, for any
  reason, the kernel closes that writer, the watchdog reads EOF and SIGKILLs its process group —
  the program and every process it started that stayed in its group (vLLM's engine processes).
  It also notices being re-parented (checked each second), in case a ``fork()`` without ``exec``
  kept a copy of the writer. A pipe, not the parent-death signal, because Linux sends that signal
  when the *thread* that forked exits, and rlkit starts servers from worker threads.
- :func:`die_with_parent` is for a child that is rlkit's own code and arms itself on Linux
  (``PR_SET_PDEATHSIG`` = SIGKILL, then ``getppid()`` checked against the expected parent, so a
  parent that died before ``prctl`` is caught too): the sandbox launcher, whose caller thread waits
  for it, loads this file by path (it imports nothing of rlkit) and calls it.
- :func:`die_with_launcher` is for the ranks rlkit's own launcher starts (``rlkit train ...
  backend.nproc=N``, ``rlkit serve tinker --nproc N``, ``rlkit conformance local --nproc N``: torch's
  elastic agent runs in the launcher's process and starts each rank in a session of its own, so
  neither the launcher's process group nor a pipe reaches them). The launcher names itself in
  :data:`LAUNCHER_PID`; a rank arms the parent-death signal (when the launcher started it from its
  main thread, whose end is the process's) and a daemon thread that SIGKILLs the rank within
  :data:`WATCH_INTERVAL_S` of seeing itself re-parented. So a ``kill -9`` of the launcher ends
  every rank at once, however the launcher was started.

Ending such a group on purpose is :func:`end_group` (the vLLM server's stop, the sandbox's kill):
ask (SIGTERM, or a signal the leader understands), wait a grace period for it to be done, then
SIGKILL the whole group.

The watchdog passes group signals through untouched: it ignores SIGTERM, SIGINT and SIGHUP itself
(the program gets them from the group), waits for the program and exits with its status (killed by
a signal: the same signal). Signal a spawned child's whole group — the returned :class:`Child`'s
``send_signal`` / ``terminate`` / ``kill`` do — so a graceful SIGTERM reaches the program once.

Standard library only, and no rlkit import: the sandbox launcher runs with ``-I -S`` and an empty
environment.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Sequence

PR_SET_PDEATHSIG = 1
#: set by rlkit's rank launcher for the ranks it starts: ``PID`` (or ``PID:thread`` when the launching
#: thread is not the main one, so the parent-death signal would fire when that thread ends)
LAUNCHER_PID = "RLKIT_LAUNCHER_PID"
WATCH_INTERVAL_S = 0.25  # how often a rank checks that its launcher is still its parent
_WRITERS: Dict[int, int] = {}  # child pid -> this process's end of its watch pipe (open while it runs)


def die_with_parent(parent_pid: int) -> bool:
    """Arm SIGKILL for this process when the thread that forked it exits (Linux); if the parent
    ``parent_pid`` is already gone (``getppid()`` differs), exit at once. Returns whether armed
    (False off Linux, where only :func:`spawn`'s watchdog applies). Call it after any change of
    credentials (``setresuid``): the kernel clears the setting then."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent_pid:  # the parent died before prctl: nobody will send the signal
        os._exit(137)
    return True


def launcher_env() -> Dict[str, str]:
    """What rlkit's rank launcher puts in its ranks' environment: this process as their launcher."""
    import threading

    main = threading.current_thread() is threading.main_thread()
    return {LAUNCHER_PID: f"{os.getpid()}" if main else f"{os.getpid()}:thread"}


def die_with_launcher() -> bool:
    """In a rank rlkit's launcher started (:data:`LAUNCHER_PID` set): die with the launcher (see the
    module docstring); whether this process is such a rank. The variable is removed, so what the
    rank starts itself is not taken for a rank. Call it first thing in the rank."""
    value = os.environ.pop(LAUNCHER_PID, "")
    if not value:
        return False
    pid_text, _, how = value.partition(":")
    launcher = int(pid_text)
    if how != "thread":
        die_with_parent(launcher)  # exits at once if the launcher is already gone
    elif os.getppid() != launcher:
        os._exit(137)
    import threading

    def watch() -> None:
        import time

        while os.getppid() == launcher:
            time.sleep(WATCH_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="rlkit-launcher-watch", daemon=True).start()
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; whether the group was there (gone is not an error)."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left (one this process may not signal counts as gone)."""
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_group(pgid: int, done: Callable[[], bool], *, sig: int = signal.SIGTERM, leader_only: bool = False,
              grace_s: float = 20.0, interval_s: float = 0.2) -> bool:
    """End the process group ``pgid`` (its leader's pid): ``sig`` to the group (to its leader alone
    with ``leader_only``: a leader that ends the rest itself), then up to ``grace_s`` for ``done()``
    (checked every ``interval_s``), then SIGKILL to the whole group. Whether it was done without
    the SIGKILL (a group already gone is done)."""
    try:
        if leader_only:
            os.kill(pgid, sig)
        else:
            os.killpg(pgid, sig)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(interval_s)
    signal_group(pgid, signal.SIGKILL)
    return False


class Child(subprocess.Popen):
    """A process started by :func:`spawn`: ``pid`` is its watchdog's, which leads the process
    group (the program and what it starts); signals go to the whole group."""

    def send_signal(self, sig: int) -> None:
        self.poll()
        if self.returncode is None:
            signal_group(self.pid, sig)

    def _forget(self) -> None:
        fd = _WRITERS.pop(self.pid, None)
        if fd is not None:
            os.close(fd)

    def poll(self) -> Any:
        code = super().poll()
        if code is not None:
            self._forget()
        return code

    def wait(self, timeout: Any = None) -> int:
        code = super().wait(timeout)
        self._forget()
        return code


def spawn(args: Sequence[str], **popen_kwargs: Any) -> Child:
    """``subprocess.Popen(args, **popen_kwargs)``, under a watchdog that SIGKILLs the program's
    process group when this process dies (see the module docstring). The child leads a new
    session (``start_new_session`` is forced), so its group is its own."""
    if not args:
        raise ValueError("spawn: no program to run")
    read_end, write_end = os.pipe()  # both close-on-exec: the write end stays in this process only
    pass_fds = tuple(popen_kwargs.pop("pass_fds", ())) + (read_end,)
    popen_kwargs["start_new_session"] = True
    watchdog = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), str(read_end), "--", *map(str, args)]
    try:
        child = Child(watchdog, pass_fds=pass_fds, **popen_kwargs)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _WRITERS[child.pid] = write_end
    return child


def _watch(parent: int, watch_fd: int, argv: List[str]) -> None:
    """The watchdog (this file as a script): run ``argv``, follow it, kill the group if the parent goes."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    os.set_inheritable(watch_fd, False)
    if os.getppid() != parent:  # the parent died before we started
        os.killpg(0, signal.SIGKILL)
    pid = os.fork()
    if pid == 0:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            os.execvp(argv[0], argv)
        except BaseException as exc:  # noqa: BLE001 - say why, as the shell would
            os.write(2, f"rlkit: cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)
    while True:
        ready, _, _ = select.select([watch_fd, wake_r], [], [], 1.0)
        if watch_fd in ready or os.getppid() != parent:  # EOF: every writer is gone, so is rlkit
            os.killpg(0, signal.SIGKILL)
        if wake_r in ready:
            os.read(wake_r, 512)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:])
