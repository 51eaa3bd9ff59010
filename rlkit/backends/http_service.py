"""The HTTP stack both local stand-ins for a remote service share (``rlkit emulate sagemaker`` and
``rlkit serve tinker``), on the same ASGI server as ``rlkit serve``: uvicorn (its h11 protocol),
driving a small raw ASGI app (:class:`ServiceApp`) that hands each request to the service's
synchronous :meth:`LocalHTTPService.handle` in a worker thread. One lifecycle: bind the socket
eagerly (a port in use fails at :meth:`~LocalHTTPService.bind`, and ``url`` works at once), serve in
the foreground or on a daemon thread, report the URL, stop, and close the service's state.

What every request gets, before the service sees it:

- framing: a request h11 cannot parse (``Content-Length: abc`` / ``-1`` / ``1e3``, two lengths
  that disagree, a bad chunk size, a malformed request line) is a 400 in the service's own error
  shape and the connection is closed; ``Content-Length`` together with ``Transfer-Encoding:
  chunked`` is a 400 too;
- size: a body over :meth:`LocalHTTPService.body_limit` is a 413 *before* it is read (the
  declared length is checked first; a chunked body is refused once it reaches the limit with more
  to come); a ``gzip`` / ``deflate`` / ``zstd`` body is limited by its *decompressed* size (a 2 KB
  zstd bomb is a 413, not 64 MiB);
- memory: the bytes of request bodies held at once — read, decompressed, and the one copy joined
  from the pieces — are bounded over *every* request of every server in the process (this stack
  and ``rlkit serve``'s app) by one budget (:mod:`rlkit.backends.http_body`: 1 GiB, or
  ``$RLKIT_BODY_BUDGET_BYTES``). A request whose next piece does not fit waits up to 5 s for
  others to finish, then is a 503 with ``Retry-After: 1``; so
  512 handlers decompressing bombs at once hold about the budget, not 512 x the body limit. A
  body that needs more than the whole budget (over about half of it, decompressed) is always a 503;
- idle connections time out (:attr:`LocalHTTPService.idle_timeout_s`): a socket that sends
  nothing, trickles a request head, or stalls mid-body is closed after that long (mid-body with a
  408). An open connection is an asyncio transport, not a thread: only requests being handled
  hold one of at most :attr:`LocalHTTPService.max_handler_threads` daemon worker threads (Tinker's
  and the emulator's result routes long-poll, so the bound is generous);
- a client that disconnects is at most a debug line, never a traceback; uvicorn's access log is off.

A subclass sets :attr:`thread_name`, implements :meth:`handle` (one request -> status, headers,
body), :meth:`http_error` (an error in the service's own shape) and :meth:`close_state`;
:meth:`bind` may be extended to check the host first. :func:`load_json` parses a JSON object the
way both services must: nesting depth, non-finite numbers and non-objects are client errors.
:func:`listen` is the listening socket every rlkit server binds (``rlkit serve`` too).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import queue
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

from rlkit.backends.http_body import BadRequestBody, BodyHold, decompress
from rlkit.errors import BackendUnavailableError, listen_error

S = TypeVar("S", bound="LocalHTTPService")
log = logging.getLogger("rlkit.http")
Response = Tuple[int, Dict[str, str], bytes]
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


# -- sockets and threads (shared with rlkit serve) ---------------------------------------------------


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a port in use, a host that is not this machine's or a
    port it may not take is a :class:`~rlkit.errors.ConfigError` (one line, exit 2 from the CLI)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on accepted connections; without it
    # Nagle + delayed ACKs add ~40 ms to every keep-alive request
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise listen_error(host, port, exc) from None
    sock.set_inheritable(True)
    return sock


def serve_in_thread(server: Any, sock: socket.socket, name: str, timeout: float = 30.0) -> threading.Thread:
    """Run ``server`` (a ``uvicorn.Server``) on ``sock`` in a daemon thread; returns once it accepts."""
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: the HTTP server did not start")
        time.sleep(0.01)
    return thread


class _Workers:
    """Daemon threads for the handlers: an idle one is reused, else a new one starts; one idle for
    ``idle_s`` exits. Daemon (unlike anyio's or ``concurrent.futures``' workers), so a handler
    long-polling a result never delays exit; a cancelled request abandons its call, which still
    runs its course. At most :attr:`LocalHTTPService.max_handler_threads` run at once (the app's
    semaphore), so this needs no bound of its own."""

    def __init__(self, name: str, idle_s: float = 10.0):
        self.name, self.idle_s = name, idle_s
        self._lock = threading.Lock()
        self._idle: "collections.deque[queue.SimpleQueue]" = collections.deque()

    def run(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
        """``fn(*args)`` on a worker, as a future of ``loop``."""
        future = loop.create_future()
        job = (loop, future, fn, args)
        with self._lock:
            mailbox = self._idle.pop() if self._idle else None
        if mailbox is not None:
            mailbox.put(job)
        else:
            threading.Thread(target=self._work, args=(job,), name=self.name, daemon=True).start()
        return future

    def _work(self, job: Any) -> None:
        mailbox: queue.SimpleQueue = queue.SimpleQueue()
        while True:
            loop, future, fn, args = job
            try:
                value, error = fn(*args), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                value, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, value, error)
            except RuntimeError:  # the loop is closed: the server stopped, nobody is waiting
                pass
            job = loop = future = fn = args = value = error = None  # hold no request (or its body) while idle
            with self._lock:
                self._idle.append(mailbox)
            try:
                job = mailbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if mailbox in self._idle:
                        self._idle.remove(mailbox)
                        return
                job = mailbox.get()  # taken just now: its job is on the way


def _settle(future: "asyncio.Future[Any]", value: Any, error: Optional[BaseException]) -> None:
    if future.done():  # cancelled: the request was abandoned
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


# -- the ASGI app --------------------------------------------------------------------------------------


class ServiceApp:
    """The raw ASGI app serving one :class:`LocalHTTPService`: limits, decompression, the handler."""

    def __init__(self, service: "LocalHTTPService"):
        self.service = service
        self._slots: Optional[asyncio.Semaphore] = None  # made on the server's loop
        self._workers = _Workers(f"{service.thread_name}-handler")

    async def __call__(self, scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return
        started = False

        async def tracked(message: Dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._serve(scope, receive, tracked)
        except asyncio.CancelledError:  # the server is stopping with this request unfinished: no traceback
            log.debug("%s %s cancelled: the server is stopping", scope.get("method"), scope.get("path"))
            if not started:
                await self._send(send, self.service.http_error(503, "the server is stopping"), close=True)

    async def _serve(self, scope: Dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        service = self.service
        headers: Dict[str, str] = {}
        for key, value in scope["headers"]:
            headers[key.decode("latin-1").lower()] = value.decode("latin-1")
        limit = service.body_limit()
        if "content-length" in headers and "transfer-encoding" in headers:
            return await self._refuse(send, BadRequestBody("both Content-Length and Transfer-Encoding: chunked"))
        declared = headers.get("content-length", "")  # h11 checked it is one decimal number
        if declared.isdigit() and int(declared) > limit:
            return await self._refuse(send, BadRequestBody(f"the request body is {declared} bytes, over the {limit}-byte limit", 413))
        hold = BodyHold()  # this request's share of the process's body budget, given back at its end
        try:
            response = await self._read_and_handle(scope, receive, headers, limit, hold)
        except BadRequestBody as err:
            return await self._refuse(send, err)
        finally:
            hold.release()
        if response is not None:
            await self._send(send, response)

    async def _read_and_handle(self, scope: Dict[str, Any], receive: Callable[..., Any], headers: Dict[str, str], limit: int,
                               hold: BodyHold) -> Optional[Response]:
        service = self.service
        body = bytearray()
        more = True
        while more:
            try:
                message = await asyncio.wait_for(receive(), timeout=service.idle_timeout_s)
            except asyncio.TimeoutError:
                raise BadRequestBody(f"no request body bytes for {service.idle_timeout_s:g} s", 408) from None
            if message["type"] == "http.disconnect":
                log.debug("client went away mid-body: %s %s", scope["method"], scope["path"])
                return None
            piece = message.get("body", b"")
            await hold.grow_async(len(piece))
            body += piece
            more = bool(message.get("more_body", False))
            if len(body) > limit or (more and len(body) >= limit):
                raise BadRequestBody(f"the request body exceeds the {limit}-byte limit", 413)
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            raw_path += "?" + scope["query_string"].decode("latin-1")
        await hold.grow_async(len(body))  # the bytes copy, while the bytearray lives
        data, body = bytes(body), bytearray()  # one copy of the body held while it is handled
        hold.shrink(len(data))
        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, int(service.max_handler_threads)))
        async with self._slots:
            return await self._workers.run(asyncio.get_running_loop(), self._handle, scope["method"], raw_path,
                                           headers, data, limit, hold)

    def _handle(self, method: str, raw_path: str, headers: Dict[str, str], body: bytes, limit: int, hold: BodyHold) -> Response:
        """Decompress and handle, in the worker thread (a decompression is CPU work too)."""
        service = self.service
        try:
            encoding = headers.get("content-encoding", "").strip().lower()
            if body and encoding and encoding != "identity":
                body = decompress(body, encoding, limit, hold)
                headers.pop("content-encoding")
            return service.handle(method, raw_path, headers, body)
        except BadRequestBody as err:
            return self._error(err)
        except Exception as exc:  # noqa: BLE001 - handle() answers its own errors; this is a bug, still in shape
            log.error("error handling %s %s: %s: %s", method, raw_path[:200], type(exc).__name__, exc)
            return service.http_error(500, f"{type(exc).__name__}: {exc}")

    def _error(self, err: BadRequestBody) -> Response:
        status, headers, payload = self.service.http_error(err.status, str(err))
        if status == 503:  # the body budget was full: worth retrying
            headers = {**headers, "Retry-After": "1"}
        return status, headers, payload

    async def _refuse(self, send: Callable[..., Any], err: BadRequestBody) -> None:
        await self._send(send, self._error(err), close=True)

    @staticmethod
    async def _send(send: Callable[..., Any], response: Response, *, close: bool = False) -> None:
        status, headers, payload = response
        out = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items() if k.lower() != "content-length"]
        out.append((b"content-length", str(len(payload)).encode()))
        if close:
            out.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": payload})


class _ClientLog(logging.LoggerAdapter):
    """uvicorn's protocol logger for a service: its warnings are about what a client sent (an invalid
    request, an unsupported upgrade), so they are debug lines; its errors stay errors."""

    @property
    def level(self) -> int:  # uvicorn reads ``logger.level`` to decide on its trace lines
        return self.logger.level

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.debug(msg, *args, **kwargs)


def _protocol(service: "LocalHTTPService") -> type:
    """uvicorn's h11 protocol, with the idle timeout applied from the first byte (uvicorn arms it only
    between requests), a request head held to one deadline (a trickled head does not reset it), and
    h11's framing refusals answered in the service's own error shape."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ServiceProtocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.logger = _ClientLog(log)  # uvicorn's lines about this server's connections, under rlkit's name

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self.timeout_keep_alive_task is not None:
                self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive = service.idle_timeout_s  # read now: a change applies to new waits
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

        def data_received(self, data: bytes) -> None:
            waiting, self.timeout_keep_alive_task = self.timeout_keep_alive_task, None
            super().data_received(data)
            if waiting is None:
                return
            head_pending = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if head_pending and self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = waiting  # the same deadline until the head is complete
            else:
                waiting.cancel()

        def on_response_complete(self) -> None:
            self.timeout_keep_alive = service.idle_timeout_s
            super().on_response_complete()

        def send_400_response(self, msg: str) -> None:
            status, headers, payload = service.http_error(
                400, "the request is not valid HTTP/1.1 (its request line, a header, Content-Length or chunked framing)")
            try:
                out = [(k, str(v)) for k, v in headers.items() if k.lower() != "content-length"]
                out += [("content-length", str(len(payload))), ("connection", "close")]
                self.transport.write(self.conn.send(h11.Response(status_code=status, headers=out, reason=b"Bad Request")))
                self.transport.write(self.conn.send(h11.Data(data=payload)))
                self.transport.write(self.conn.send(h11.EndOfMessage()))
            except h11.LocalProtocolError:  # a response had already started: just close
                pass
            self.transport.close()

    return ServiceProtocol


# -- the lifecycle -------------------------------------------------------------------------------------


class LocalHTTPService:
    thread_name = "rlkit-http"
    idle_timeout_s: float = 60.0  # a connection that sends nothing for this long is closed
    max_body_bytes: int = 256 << 20  # the default body_limit()
    max_handler_threads: int = 512  # requests handled at once; more wait for a slot (long-polls hold one)
    shutdown_grace_s: int = 2  # stop(): how long in-flight requests may finish before they are cancelled

    _sock: Optional[socket.socket] = None
    _address: Optional[Tuple[str, int]] = None
    _server: Any = None
    _thread: Optional[threading.Thread] = None

    def handle(self, method: str, raw_path: str, headers: Dict[str, str], body: bytes) -> Response:
        """One request (``headers`` lower-cased, ``body`` already decompressed) -> its response.
        Called in a worker thread; may block (a long-poll holds only its own thread)."""
        raise NotImplementedError

    def http_error(self, status: int, message: str) -> Response:
        """An error response in the service's own shape."""
        return status, {"Content-Type": "application/json"}, json.dumps({"message": message}).encode()

    def body_limit(self) -> int:
        """The largest request body accepted, before and after decompression."""
        return self.max_body_bytes

    def close_state(self) -> None:
        """Release what the service holds (sessions, engines); called by :meth:`stop`."""

    def _uvicorn(self) -> Any:
        import uvicorn

        assert self._sock is not None, "bind() first"
        config = uvicorn.Config(
            ServiceApp(self), http=_protocol(self), ws="none", lifespan="off", interface="asgi3", loop="asyncio",
            log_config=None, log_level="warning", access_log=False, proxy_headers=False, server_header=False,
            timeout_keep_alive=self.idle_timeout_s, timeout_graceful_shutdown=self.shutdown_grace_s,
            port=self._sock.getsockname()[1],
        )
        self._server = uvicorn.Server(config)
        return self._server

    # -- lifecycle --------------------------------------------------------------------------------
    def bind(self: S, host: str = "127.0.0.1", port: int = 0) -> S:
        """Take ``host:port`` now (``port=0`` picks a free one); a port in use is a ConfigError here."""
        try:
            import uvicorn  # noqa: F401
        except ImportError:
            raise BackendUnavailableError(
                f"{self.thread_name}: serving needs uvicorn (pip install 'rlkit[tinker]' or 'rlkit[sagemaker]')") from None
        self._sock = listen(host, port)
        self._address = tuple(self._sock.getsockname()[:2])  # type: ignore[assignment]
        return self

    def start(self: S, host: str = "127.0.0.1", port: int = 0) -> S:
        """Serve on a background thread (``port=0`` picks a free port); returns once accepting."""
        if self._sock is None:
            self.bind(host, port)
        assert self._sock is not None
        self._thread = serve_in_thread(self._uvicorn(), self._sock, self.thread_name)
        return self

    def serve_forever(self) -> None:
        """Serve in the foreground until Ctrl-C / SIGTERM (uvicorn's graceful shutdown), then return."""
        assert self._sock is not None, "bind() first"
        self._uvicorn().run(sockets=[self._sock])

    def serve_until_signalled(self, stopped: str) -> int:
        """The foreground of a ``rlkit serve``/``emulate`` command: SIGTERM becomes the same clean
        shutdown as Ctrl-C, the service is stopped whatever happens, ``stopped`` is printed; 0."""
        import signal

        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _term)
        try:
            self.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
            print(stopped, flush=True)
        return 0

    @property
    def address(self) -> Tuple[str, int]:
        """The (host, port) bound."""
        assert self._address is not None, "bind() first"
        return self._address

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def stop(self) -> None:
        server, thread, sock = self._server, self._thread, self._sock
        self._server = self._thread = self._sock = None
        if server is not None:
            server.should_exit = True
        if thread is not None:
            thread.join(self.shutdown_grace_s + 5.0)
        if sock is not None:
            sock.close()
        self.close_state()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
