"""openenv's own server on an ``Environment`` class: the child process rlkit starts for
``train.task.env=module:Class train.task.serve=true`` (:func:`rlkit.tasks.envs.openenv_task.start_server`
runs it under :func:`rlkit.lifetime.spawn`, so it dies with rlkit however rlkit ends). It binds a free
loopback port itself (no port race), prints :data:`READY` and the URL once listening, and serves
``openenv.core.env_server.http_server.create_app(Class, Action, Observation)`` with uvicorn, allowing ``max_concurrent_envs`` WebSocket sessions when the class declares
``SUPPORTS_CONCURRENT_SESSIONS`` (else one: openenv refuses more for such an environment).
"""

from __future__ import annotations

import argparse
import socket
from typing import List, Optional

from rlkit.tasks.envs.openenv_task import READY, env_types, environment_class


def main(argv: Optional[List[str]] = None) -> None:
    import uvicorn
    from openenv.core.env_server.http_server import create_app

    from rlkit.imports import ensure_user_paths

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
