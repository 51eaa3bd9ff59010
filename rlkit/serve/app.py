"""The HTTP side (needs the ``serve`` extra: fastapi, uvicorn): a FastAPI app speaking OpenAI's chat-completions routes, and a uvicorn runner.

Routes: ``POST /v1/chat/completions`` (JSON, or server-sent events with ``stream: true``),
``GET /v1/models``, ``GET /v1/models/{id}``, and ``GET /health`` (no auth; what is being served;
``"status": "degraded"`` with ``refused`` when ``--follow`` refused a newer checkpoint, see
:class:`~rlkit.serve.sources.RunFollower`).

Every error — a bad body, a wrong key, an unknown route, a too-large request, a failure while
sampling — is answered with OpenAI's body ``{"error": {"message", "type", "param", "code"}}`` and
the status OpenAI uses (400, 401, 404, 405, 413, 500; 503 with ``Retry-After`` when the process's
budget of request-body bytes is full, see :class:`BodyLimit`).
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlkit.backends.http_body import BadRequestBody, BodyHold
from rlkit.backends.http_service import listen, serve_in_thread
from rlkit.serve.completions import ChatService
from rlkit.serve.live import open_live_stream
from rlkit.serve.protocol import APIError, Limits, model_card, parse_chat_request
from rlkit.serve.sources import ModelSource

log = logging.getLogger("rlkit.serve")


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``max_bytes`` with 413 (declared or streamed),
    and take the bytes read from the process's body budget (:class:`~rlkit.backends.http_body.BodyHold`,
    counted twice: the pieces and the copy joined from them) until the request ends; a piece that
    does not fit within the budget's wait is a 503 with ``Retry-After: 1``."""

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        hold = BodyHold()

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                piece = len(message.get("body", b""))
                seen += piece
                if seen > self.max_bytes:
                    raise self._error()
                try:
                    await hold.grow_async(2 * piece)
                except BadRequestBody as err:
                    raise APIError(503, f"The server is busy: {err}.", type="server_error", code="server_busy") from None
            return message

        async def send_then_release(message: Any) -> None:
            # the budget is given back before the response's last byte leaves, so a client that
            # has its answer never finds this request's bytes still held
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                hold.release()
            await send(message)

        try:
            await self.app(scope, limited, send_then_release)
        finally:
            hold.release()

    def _error(self) -> APIError:
        return APIError(413, f"Request too large: the body exceeds this server's limit of {self.max_bytes} bytes.", code="request_too_large")

    async def _refuse(self, send: Any) -> None:
        body = json.dumps(self._error().body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def create_app(source: ModelSource, *, api_key: Optional[str] = None, limits: Optional[Limits] = None) -> Any:
    """The FastAPI app serving ``source`` (a :class:`ModelSource`, or the SageMaker proxy, which
    completes requests itself); ``api_key`` turns on bearer-token auth."""
    limits = limits or Limits()
    # a source that completes requests itself (the SageMaker proxy) is its own service
    service = source if hasattr(source, "complete") else ChatService(source, limits)
    app = FastAPI(title="rlkit serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    app.add_middleware(BodyLimit, max_bytes=limits.max_request_bytes)
    add_error_handlers(app)

    def headers_for(snapshot: Any) -> dict:
        return {"x-rlkit-checkpoint": snapshot.checkpoint or "base", "openai-model": source.name}

    @app.get("/health")
    async def health() -> Any:
        return {**source.health(), "model": source.name, **source.current().describe()}

    def card() -> dict:
        snap = source.current()
        return model_card(source.name, created=int(snap.loaded_at), rlkit=snap.describe())

    @app.get("/v1/models")
    async def list_models(request: Request) -> Any:
        authorize(request, api_key)
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> Any:
        authorize(request, api_key)
        if not source.accepts(model):
            raise APIError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
        return card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        authorize(request, api_key)
        req = read_chat_request(await request.body(), limits)
        snapshot, completion, chunks = await run_completion(service, req)
        headers = headers_for(snapshot)
        if not req.stream:
            return JSONResponse(completion.body(), headers=headers)
        events = server_sent_events(chunks or replayed(completion))
        return StreamingResponse(events, media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})

    return app


def error_response(err: APIError) -> Any:
    """An :class:`APIError` as OpenAI answers it (``WWW-Authenticate`` on a 401, ``Retry-After`` on a 503)."""
    headers = {"www-authenticate": "Bearer"} if err.status == 401 else {"retry-after": "1"} if err.status == 503 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def add_error_handlers(app: Any) -> None:
    """Every error the app can meet answered in OpenAI's shape: ours, Starlette's 404/405, a bad
    body, and anything unexpected (a 500, never plain text)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError) -> Any:
        return error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Any:
        if err.status_code == 404:
            message = f"Unknown request URL: {request.method} {request.url.path}."
            return error_response(APIError(404, message, code="unknown_url"))
        if err.status_code == 405:
            return error_response(APIError(405, f"Method {request.method} is not allowed for {request.url.path}.", code="method_not_allowed"))
        return error_response(APIError(err.status_code, str(err.detail), code=None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> Any:  # still OpenAI-shaped, never plain text
        log.error("unexpected error on %s %s: %s: %s", request.method, request.url.path, type(err).__name__, err)
        message = f"The server had an error while processing your request: {type(err).__name__}."
        return error_response(APIError(500, message, type="server_error"))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, err: RequestValidationError) -> Any:
        return error_response(APIError(400, f"Invalid request: {err.errors()}", code="invalid_value"))


def authorize(request: Request, api_key: Optional[str]) -> None:
    """Refuse (401) a request without ``Authorization: Bearer <api_key>`` when a key is set."""
    if not api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise APIError(401, "You didn't provide an API key. Provide it in an Authorization header (Authorization: Bearer YOUR_KEY).", code="missing_api_key")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        shown = token.strip()
        shown = (shown[:3] + "*" * 4 + shown[-4:]) if len(shown) > 8 else "*" * len(shown)
        raise APIError(401, f"Incorrect API key provided: {shown}.", code="invalid_api_key")


def read_chat_request(raw: bytes, limits: Limits) -> Any:
    """A chat-completions body, parsed and checked (400 for bad JSON or a bad request)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}.", code="invalid_json") from None
    except RecursionError:
        message = "We could not parse the JSON body of your request: it is nested too deeply."
        raise APIError(400, message, code="invalid_json") from None
    try:
        return parse_chat_request(body, limits)
    except RecursionError:
        raise APIError(400, "Invalid request: a value is nested too deeply.", code="invalid_value") from None


async def run_completion(service: Any, req: Any) -> Tuple[Any, Any, Optional[AsyncIterator[Any]]]:
    """``(snapshot, completion, chunks)``: a streamed request the service can stream live gets its
    content deltas as the sampler picks tokens (``chunks``, :mod:`rlkit.serve.live`; no completion),
    any other the whole completion (no chunks). A failure inside the model is a 500, still OpenAI-shaped."""
    live = req.stream and getattr(service, "can_stream_live", lambda _req: False)(req)
    try:
        if live:
            snapshot, chunks = await open_live_stream(service, req)
            return snapshot, None, chunks
        completion = await service.complete(req)
        return completion.snapshot, completion, None
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failure inside the model is a 500, still OpenAI-shaped
        log.exception("chat completion failed")
        raise APIError(500, f"The server had an error while processing your request: {type(exc).__name__}: {exc}", type="server_error") from None


async def replayed(completion: Any) -> AsyncIterator[Any]:
    """A finished completion's stream chunks."""
    for chunk in completion.chunks():
        yield chunk


async def server_sent_events(chunks: Any) -> AsyncIterator[bytes]:
    """``chunks`` as server-sent events, ending with ``[DONE]``."""
    try:
        async for chunk in chunks:
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:  # a disconnect (cancel or close) also closes the sampling stream, cancelling it
        await chunks.aclose()


# -- running it ------------------------------------------------------------------------------------


@dataclass
class RunningServer:
    """A uvicorn server on a background thread (:func:`start_server`)."""

    server: Any
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as ``base_url``."""
        return self.url + "/v1"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _config(app: Any, host: str, port: int, log_level: str, access_log: bool = False) -> Any:
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", timeout_keep_alive=30,
                          access_log=access_log)


def start_server(app: Any, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> RunningServer:
    """Serve ``app`` on a background thread; ``port=0`` picks a free port. Returns once listening."""
    import uvicorn

    sock = listen(host, port)
    server = uvicorn.Server(_config(app, host, sock.getsockname()[1], log_level))
    thread = serve_in_thread(server, sock, "rlkit-serve")
    return RunningServer(server, thread, host, sock.getsockname()[1])


def run_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    ready: Optional[Any] = None,
    sock: Optional[socket.socket] = None,
    access_log: bool = False,
) -> None:
    """Serve ``app`` in the foreground until interrupted; ``ready(url)`` is called once listening.
    ``sock``: an already listening socket (:func:`listen`) instead of binding ``host:port`` here.
    ``access_log``: uvicorn's line per request (off unless asked: ``rlkit serve --access-log``)."""
    import uvicorn

    sock = sock if sock is not None else listen(host, port)
    server = uvicorn.Server(_config(app, host, sock.getsockname()[1], log_level, access_log))
    if ready is not None:
        def announce() -> None:
            while not server.started and not server.should_exit:
                time.sleep(0.02)
            if server.started:
                ready(f"http://{host}:{sock.getsockname()[1]}")

        threading.Thread(target=announce, daemon=True).start()
    server.run(sockets=[sock])
