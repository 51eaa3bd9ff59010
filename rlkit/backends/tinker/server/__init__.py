"""A Tinker-compatible server backed by rlkit's local engine.

The unmodified ``tinker`` SDK (and tinker-cookbook's recipes, which depend only on it) trains on
this machine's CPU or GPU when pointed here::

    from rlkit.backends.tinker.server import TinkerServer
    with TinkerServer().start() as server:
        os.environ.update(server.env())     # TINKER_BASE_URL, TINKER_API_KEY
        service = tinker.ServiceClient()
        ...

or from a shell: ``rlkit serve tinker --port 8000``. What it honours and refuses:
``docs/tinker.md``. Needs the SDK (``pip install 'rlkit[tinker]'``) for its protobuf messages,
and uvicorn (in that extra) for its HTTP server (``rlkit.backends.http_service``).
"""

from rlkit.backends.tinker.server.http import TinkerServer
from rlkit.backends.tinker.server.state import ServerOptions

__all__ = ["ServerOptions", "TinkerServer"]
