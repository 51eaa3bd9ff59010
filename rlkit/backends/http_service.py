"""The lifecycle both local stand-ins for a remote service share (``rlkit emulate sagemaker`` and
``rlkit serve tinker``): bind a :class:`~http.server.ThreadingHTTPServer`, serve in the foreground
or on a daemon thread, report the URL, stop, and close the service's state.

A subclass sets :attr:`thread_name`, implements :meth:`handler_class` (the request handler bound to
this instance) and :meth:`close_state`; :meth:`bind` may be extended to check the host first.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Type, TypeVar

S = TypeVar("S", bound="LocalHTTPService")


class LocalHTTPService:
    thread_name = "rlkit-http"

    _httpd: Optional[ThreadingHTTPServer] = None
    _thread: Optional[threading.Thread] = None

    def handler_class(self) -> Type[BaseHTTPRequestHandler]:
        """A request-handler class bound to this instance."""
        raise NotImplementedError

    def close_state(self) -> None:
        """Release what the service holds (sessions, engines); called by :meth:`stop`."""

    # -- lifecycle --------------------------------------------------------------------------------
    def bind(self: S, host: str = "127.0.0.1", port: int = 0) -> S:
        self._httpd = ThreadingHTTPServer((host, port), self.handler_class())
        self._httpd.daemon_threads = True
        return self

    def start(self: S, host: str = "127.0.0.1", port: int = 0) -> S:
        """Serve on a background thread (``port=0`` picks a free port)."""
        if self._httpd is None:
            self.bind(host, port)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        assert self._httpd is not None, "bind() first"
        self._httpd.serve_forever()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "bind() first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self.close_state()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
