"""``python -m rlkit ARGS`` for the tests, started warm: each command is a child forked from an
interpreter that has already imported torch, transformers, peft, Hydra and rlkit (about 5 s of
imports a command on this machine, most of a tiny run's time), instead of a fresh interpreter.

The command still runs in its own process, with its own pid, working directory, environment,
``sys.argv``, standard streams (pipes the caller reads), exit code and ``atexit`` handlers: the
child runs ``rlkit/__main__.py`` with :func:`runpy.run_module` exactly as ``python -m rlkit`` does,
and leaves the interpreter the way a script ends (uncaught exception: traceback, exit code 1). What
differs is only what was decided while those modules were imported, so there is one warm
interpreter per environment as imports read it (``PYTHON*`` but ``PYTHONPATH``, which the child
applies; ``LD_*``, OpenMP/MKL threads, ``HF_*``, ``TRANSFORMERS_*``, ``TORCH*``, CUDA), started with
that environment; a command that chooses the allocator starts cold, as does every command when
``RLKIT_TEST_COLD=1``. The warm interpreter runs on the allocator the ``rlkit`` command re-executes
itself onto (:mod:`rlkit.malloc_preload`), so children do not re-execute. Tests about how the
command starts, signals, process groups or the allocator use :mod:`subprocess` directly.
tests/test_warm_rlkit.py holds the warm and the cold start to the same answers.

Protocol (a Unix SEQPACKET socket, one connection a command): the caller sends
``{"args", "cwd", "env"}`` with its stdin/stdout/stderr descriptors; a supervisor forked for the
connection forks the command, answers ``{"pid"}``, waits for it and answers ``{"returncode"}``
(negative: the signal that ended it).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Sequence

#: what the warm interpreter imports before it forks (what every rlkit command imports first)
PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "peft", "hydra", "omegaconf", "yaml",
           "rlkit", "rlkit.cli", "rlkit.backends.local.models", "rlkit.backends.local.engine")
#: environment variables read while those modules import: a command that changes one starts cold
IMPORT_TIME_ENV = re.compile(r"^(PYTHON(?!PATH$)|LD_|OMP_|MKL_|KMP_|GOMP_|HF_|HUGGINGFACE_|TRANSFORMERS_|TORCH|CUDA|NCCL|RLKIT_ALLOCATOR$"
                             r"|MIMALLOC_|TOKENIZERS_|PYTORCH_)")
READY = "warm-rlkit-ready"
MAX_MESSAGE = 1 << 20


# ---- the warm interpreter (python tests/warm_rlkit.py SOCKET) ----

def _serve(path: str) -> dict:
    """Import PRELOAD, then accept commands until the test process is gone. Returns only in a
    forked command's process, with its request."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(16)
    server.settimeout(2.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    gc.freeze()  # the collector leaves the imported modules' objects alone: children share their pages
    print(READY, flush=True)
    sys.stderr.flush()
    while True:
        try:
            conn, _ = server.accept()
        except socket.timeout:
            if os.getppid() != parent:  # the test process ended: so do we
                os._exit(0)
            continue
        if os.fork() == 0:  # the supervisor of one command
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            conn.settimeout(None)
            return _supervise(conn)
        conn.close()


def _supervise(conn: socket.socket) -> dict:
    data, fds, _flags, _addr = socket.recv_fds(conn, MAX_MESSAGE, 3)
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:  # the command
        conn.close()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        return request
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode())
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
    except OSError:  # the caller gave up (its timeout) and went
        pass
    os._exit(0)


def _become_the_command(request: dict, base_path: List[str]) -> None:
    """What ``python -m rlkit ARGS`` would have been, from here on: working directory,
    environment, ``sys.argv``/``sys.path`` (``-m``: the working directory first, then
    ``$PYTHONPATH``), default signal handlers as a fresh interpreter has them."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *base_path]
    import importlib

    importlib.invalidate_caches()
    sys.argv = ["-m", *request["args"]]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _main() -> None:
    path = sys.argv[1]
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in own]  # without the script's folder and $PYTHONPATH
    request = _serve(path)
    _become_the_command(request, base_path)
    os._exit(_run_as_python_m_rlkit())


def _run_as_python_m_rlkit() -> int:
    """Run ``rlkit/__main__.py`` as ``python -m rlkit`` does and end as the interpreter ends: an
    uncaught exception printed by ``sys.excepthook`` (exit code 1; ``KeyboardInterrupt``: killed by
    SIGINT), then non-daemon threads joined, ``atexit`` handlers run, standard streams flushed. The
    interpreter's own teardown of every module is skipped (``os._exit``): in a forked child it
    would copy the warm interpreter's whole heap page by page, about 1.5 s a command here."""
    import runpy
    import traceback

    code = 0
    interrupted = False
    try:
        runpy.run_module("rlkit", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what the interpreter would print and exit with
        interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize does first: join non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code & 0xFF


# ---- the caller (the test process) ----

class _Warm:
    """One warm interpreter, started with the environment (what imports read) of its first command."""

    def __init__(self, env: Dict[str, str]) -> None:
        self.env = dict(env)
        self.lock = threading.Lock()
        self.proc: Optional[subprocess.Popen] = None
        self.path = ""

    def socket_path(self) -> str:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            return self.path

    def _start(self) -> None:
        from rlkit import malloc_preload

        self.path = os.path.join(tempfile.mkdtemp(prefix="warm-rlkit-"), "socket")
        lib = malloc_preload.library()  # as the rlkit command re-executes itself (malloc_preload.reexec_on_allocator)
        env = malloc_preload.preloaded_env(lib, self.env) if lib else dict(self.env)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != READY:
            raise RuntimeError(f"the warm rlkit interpreter did not start (it printed {line!r})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.path:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)  # its socket's folder


#: the warm interpreters of this test process, one per environment as imports read it (at most MAX_WARM)
_WARM: Dict[tuple, _Warm] = {}
_WARM_LOCK = threading.Lock()
MAX_WARM = 3
#: a command that sets these starts cold: how the process starts is what it is about
COLD_ENV = re.compile(r"^(LD_PRELOAD|RLKIT_ALLOCATOR|MIMALLOC_.*|RLKIT_TEST_COLD)$")


def starts_warm(env: Dict[str, str]) -> bool:
    changed = {k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)}
    return not os.environ.get("RLKIT_TEST_COLD") and not any(COLD_ENV.match(k) for k in changed)


def _warm_for(env: Dict[str, str]) -> _Warm:
    key = tuple(sorted((k, v) for k, v in env.items() if IMPORT_TIME_ENV.match(k)))
    with _WARM_LOCK:
        if key not in _WARM:
            if len(_WARM) >= MAX_WARM:
                _WARM.pop(next(iter(_WARM))).stop()
            _WARM[key] = _Warm(env)
        return _WARM[key]


@atexit.register
def _stop_all() -> None:
    for warm in _WARM.values():
        warm.stop()


def run(args: Sequence[str], *, cwd=None, env: Optional[Dict[str, str]] = None, timeout: float = 300,
        input: Optional[str] = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "rlkit", *args], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout)``, started warm where it can be (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    args = [str(a) for a in args]
    if input is not None or not starts_warm(env):
        return subprocess.run([sys.executable, "-m", "rlkit", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, input=input)
    return _run_warm(args, cwd=os.path.abspath(cwd or os.getcwd()), env=env, timeout=timeout)


def _run_warm(args: List[str], *, cwd: str, env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    path = _warm_for(env).socket_path()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    chunks: Dict[int, List[bytes]] = {out_r: [], err_r: []}

    def drain(fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            for block in iter(lambda: f.read1(65536), b""):
                chunks[fd].append(block)

    readers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in (out_r, err_r)]
    pid = None
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps({"args": args, "cwd": cwd, "env": env}).encode()],
                        [stdin, out_w, err_w])
        for fd in (stdin, out_w, err_w):
            os.close(fd)
        for reader in readers:
            reader.start()
        conn.settimeout(timeout)
        pid = json.loads(conn.recv(MAX_MESSAGE))["pid"]
        try:
            answer = conn.recv(MAX_MESSAGE)
        except socket.timeout:
            os.kill(pid, signal.SIGKILL)
            for reader in readers:
                reader.join(5)
            raise subprocess.TimeoutExpired(["rlkit", *args], timeout, b"".join(chunks[out_r]), b"".join(chunks[err_r])) from None
        returncode = json.loads(answer)["returncode"]
        for reader in readers:
            reader.join()
    finally:
        conn.close()
    text = {fd: b"".join(parts).decode(errors="replace").replace("\r\n", "\n") for fd, parts in chunks.items()}
    return subprocess.CompletedProcess([sys.executable, "-m", "rlkit", *args], returncode, text[out_r], text[err_r])


if __name__ == "__main__":
    _main()
