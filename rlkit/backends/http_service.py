"""The HTTP lifecycle both local stand-ins for a remote service share (``rlkit emulate sagemaker``
and ``rlkit serve tinker``): bind a :class:`~http.server.ThreadingHTTPServer`, serve in the
foreground or on a daemon thread, report the URL, stop, and close the service's state — and read
each request the same hardened way (:class:`ServiceHandler`):

- framing: a ``Content-Length`` that is not a decimal number (``abc``, ``-1``) or two that
  disagree is a 400 and the connection is closed; a chunked body is read chunk by chunk, bounded;
- size: a body over :meth:`LocalHTTPService.body_limit` is a 413 *before* it is read (the
  declared length is checked first; a chunked one stops at the limit); a ``gzip`` / ``deflate`` /
  ``zstd`` body is limited by its *decompressed* size (a 2 KB zstd bomb is a 413, not 64 MiB);
- idle connections time out (:attr:`LocalHTTPService.idle_timeout_s`), so a slow or silent
  socket holds its thread for that long at most;
- a client that disconnects is a debug line, never a traceback.

A subclass sets :attr:`thread_name`, implements :meth:`handle` (one request -> status, headers,
body), :meth:`http_error` (an error in the service's own shape) and :meth:`close_state`;
:meth:`bind` may be extended to check the host first. :func:`load_json` parses a JSON object the
way both services must: nesting depth, non-finite numbers and non-objects are client errors.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple, TypeVar

S = TypeVar("S", bound="LocalHTTPService")
log = logging.getLogger("rlkit.http")
Response = Tuple[int, Dict[str, str], bytes]
_DIGITS = re.compile(r"[0-9]{1,18}")
MAX_JSON_DEPTH = 64


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    name = host.strip().strip("[]")
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    if name.lower() == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(name, None) if name else []
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


class BadRequestBody(ValueError):
    """A body that cannot be a request: its HTTP ``status`` (400 or 413) and a one-line message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequestBody(f"the number {text[:40]} is out of range (not a finite double)")
    return value


def _no_constant(text: str) -> Any:
    raise BadRequestBody(f"{text} is not JSON (non-finite numbers are refused)")


def _depth(text: str) -> int:
    """The deepest ``[`` / ``{`` nesting of a JSON text (outside strings), cheaply, before parsing."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def load_json(body: bytes, *, what: str = "the request body") -> Dict[str, Any]:
    """``body`` as a JSON object (``{}`` if empty). Raises :class:`BadRequestBody` for text that is
    not UTF-8 or not JSON, nested deeper than :data:`MAX_JSON_DEPTH`, with non-finite numbers
    (``1e400``, ``NaN``), or that is not an object."""
    if not body:
        return {}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequestBody(f"{what} is not UTF-8") from None
    if ("[" in text or "{" in text) and _depth(text) > MAX_JSON_DEPTH:
        raise BadRequestBody(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except BadRequestBody:
        raise
    except (ValueError, RecursionError):
        raise BadRequestBody(f"{what} is not valid JSON") from None
    if not isinstance(value, dict):
        raise BadRequestBody(f"{what} must be a JSON object")
    return value


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded from ``Content-Encoding: encoding``, refused (413) past ``limit`` bytes of output."""
    encoding = encoding.strip().lower()
    too_big = BadRequestBody(f"the request body decompresses to more than the {limit}-byte limit", 413)
    try:
        if encoding == "zstd":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
            out = reader.read(limit + 1)
            while len(out) <= limit:
                more = reader.read(limit + 1 - len(out))
                if not more:
                    break
                out += more
        elif encoding in ("gzip", "x-gzip", "deflate"):
            d = zlib.decompressobj(wbits=47 if encoding != "deflate" else 15)
            out = d.decompress(body, limit + 1)
        else:
            raise BadRequestBody(f"Content-Encoding {encoding!r} is not supported (gzip, deflate or zstd)", 415)
    except BadRequestBody:
        raise
    except Exception:  # noqa: BLE001 - zstd / zlib errors: a corrupt body is the client's
        raise BadRequestBody(f"the request body is not valid {encoding} data") from None
    if len(out) > limit:
        raise too_big
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout, BrokenPipeError)):
            log.debug("client %s went away: %s", client_address, exc)
        else:
            log.warning("error serving %s: %s: %s", client_address, type(exc).__name__, exc)


class ServiceHandler(BaseHTTPRequestHandler):
    """Reads one request with the framing and size checks above, hands it to the service."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY: headers and body are two writes (delayed-ACK stalls otherwise)
    service: "LocalHTTPService"

    def setup(self) -> None:
        self.timeout = self.service.idle_timeout_s  # StreamRequestHandler applies it to the socket
        super().setup()

    def _reply(self, status: int, headers: Dict[str, str], payload: bytes, *, close: bool = False) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def _refuse(self, err: BadRequestBody) -> None:
        status, headers, payload = self.service.http_error(err.status, str(err))
        self._reply(status, headers, payload, close=True)

    def _read_body(self, limit: int) -> bytes:
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        lengths = self.headers.get_all("Content-Length") or []
        if chunked:
            if lengths:
                raise BadRequestBody("both Content-Length and Transfer-Encoding: chunked")
            return self._read_chunked(limit)
        if not lengths:
            return b""
        if len(set(v.strip() for v in lengths)) != 1 or not _DIGITS.fullmatch(lengths[0].strip()):
            raise BadRequestBody(f"Content-Length {lengths[0][:40]!r} is not a byte count")
        length = int(lengths[0])
        if length > limit:
            raise BadRequestBody(f"the request body is {length} bytes, over the {limit}-byte limit", 413)
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            raise ConnectionError("the client closed the connection mid-body")
        return body

    def _read_chunked(self, limit: int) -> bytes:
        parts, total = [], 0
        while True:
            line = self.rfile.readline(66)
            size_text = line.split(b";", 1)[0].strip()
            if not re.fullmatch(rb"[0-9A-Fa-f]{1,15}", size_text or b"-"):
                raise BadRequestBody("bad chunk size in a chunked body")
            size = int(size_text, 16)
            if size == 0:
                while self.rfile.readline(1026) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(parts)
            total += size
            if total > limit:
                raise BadRequestBody(f"the chunked request body exceeds the {limit}-byte limit", 413)
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise ConnectionError("the client closed the connection mid-chunk")
            parts.append(chunk)
            self.rfile.readline(3)  # the CRLF after the chunk

    def _serve(self) -> None:
        limit = self.service.body_limit()
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = self._read_body(limit)
            encoding = headers.get("content-encoding", "").strip().lower()
            if body and encoding and encoding != "identity":
                body = decompress(body, encoding, limit)
                headers.pop("content-encoding")
        except BadRequestBody as err:
            self._refuse(err)
            return
        status, out_headers, payload = self.service.handle(self.command, self.path, headers, body)
        self._reply(status, out_headers, payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        log.debug("%s - %s", self.address_string(), format % args)


class LocalHTTPService:
    thread_name = "rlkit-http"
    idle_timeout_s: float = 60.0  # a connection that sends nothing for this long is closed
    max_body_bytes: int = 256 << 20  # the default body_limit()

    _httpd: Optional[ThreadingHTTPServer] = None
    _thread: Optional[threading.Thread] = None

    def handle(self, method: str, raw_path: str, headers: Dict[str, str], body: bytes) -> Response:
        """One request (``headers`` lower-cased, ``body`` already decompressed) -> its response."""
        raise NotImplementedError

    def http_error(self, status: int, message: str) -> Response:
        """An error response in the service's own shape."""
        return status, {"Content-Type": "application/json"}, json.dumps({"message": message}).encode()

    def body_limit(self) -> int:
        """The largest request body accepted, before and after decompression."""
        return self.max_body_bytes

    def close_state(self) -> None:
        """Release what the service holds (sessions, engines); called by :meth:`stop`."""

    def handler_class(self) -> type:
        """The request-handler class bound to this instance."""

        class Bound(ServiceHandler):
            service = self

        return Bound

    # -- lifecycle --------------------------------------------------------------------------------
    def bind(self: S, host: str = "127.0.0.1", port: int = 0) -> S:
        self._httpd = _Server((host, port), self.handler_class())
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
