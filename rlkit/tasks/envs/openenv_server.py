"""openenv's own server on an ``Environment`` class, started by rlkit as a child that dies with rlkit
(``train.task.env=module:Class train.task.serve=true``; :mod:`rlkit.tasks.envs.openenv_task`).

``start(env, action, max_concurrent_envs)`` runs ``python -m rlkit.tasks.envs.openenv_server`` under
:func:`rlkit.lifetime.spawn` (killed with rlkit, however rlkit ends) and returns once the child
prints the URL it listens on (it binds a free loopback port itself, so no port race). The child
serves ``openenv.core.env_server.http_server.create_app(Class, Action, Observation)`` with
uvicorn, allowing ``max_concurrent_envs`` WebSocket sessions when the class declares
``SUPPORTS_CONCURRENT_SESSIONS`` (else one: openenv refuses more for such an environment).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, List, Optional

from rlkit.errors import ConfigError

READY = "rlkit-openenv-server listening "


@dataclass
class ServedEnv:
    url: str
    child: Any

    def stop(self) -> None:
        from rlkit.lifetime import end_group

        end_group(self.child.pid, lambda: self.child.poll() is not None)
        self.child.wait()


def start(env: str, action: Optional[str], max_concurrent_envs: int, timeout_s: float = 60.0) -> ServedEnv:
    """Start the server on ``env`` (``module:Class``); one ConfigError line if it does not come up."""
    import subprocess

    from rlkit.lifetime import spawn

    args = [sys.executable, "-m", "rlkit.tasks.envs.openenv_server", "--env", env, "--max-concurrent-envs", str(max_concurrent_envs)]
    if action:
        args += ["--action", action]
    child = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    assert child.stdout is not None
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if line.startswith(READY):
            return ServedEnv(line[len(READY):].strip(), child)
        if not line and child.poll() is not None:
            break
    child.kill()
    err = (child.stderr.read() if child.stderr else "").strip().splitlines()
    raise ConfigError(f"train.task.serve: openenv's server on {env} did not start ({err[-1] if err else 'no output'})")


def main(argv: Optional[List[str]] = None) -> None:
    import uvicorn
    from openenv.core.env_server.http_server import create_app

    from rlkit.imports import ensure_user_paths
    from rlkit.tasks.envs.openenv_task import env_types, environment_class

    parser = argparse.ArgumentParser(prog="python -m rlkit.tasks.envs.openenv_server")
    parser.add_argument("--env", required=True)
    parser.add_argument("--action")
    parser.add_argument("--max-concurrent-envs", type=int, default=64)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    ensure_user_paths()
    cls = environment_class(args.env)
    act, obs = env_types(cls, args.action)
    concurrent = args.max_concurrent_envs if getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False) else 1
    app = create_app(cls, act, obs, max_concurrent_envs=concurrent)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))

    async def serve() -> None:
        import asyncio

        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        print(f"{READY}http://{args.host}:{sock.getsockname()[1]}", flush=True)
        await task

    import asyncio

    asyncio.run(serve())


if __name__ == "__main__":
    main()
