"""The HTTP server: Tinker's ``/api/v1`` routes, auth and fault injection.

Auth: the SDK sends its API key in ``X-API-Key`` (it refuses keys that do not start with
``tml-``). Bound to a loopback address with no key configured, the server accepts any key; bound
anywhere else it refuses to start without one (``--api-key`` / ``$RLKIT_TINKER_API_KEY``), and
with keys it answers 401 to every request that does not carry one of them.

Ownership: the API key is the only caller identity on Tinker's wire (the SDK sends no session id
in a header; ``forward_backward``, ``optim_step``, ``asample`` and ``retrieve_future`` name only the
run, sampler or request they are about). So with several keys (``--api-key`` repeated), each key
owns the sessions, runs, samplers, futures and checkpoints created with it, and another key's are
404 exactly like ids that never existed (lists show only the caller's). Between clients of one
key, what keeps them apart is that every id is unguessable (sessions are UUID4s, model and
sampler ids start with their session's, request ids carry 128 random bits).

Fault injection (:class:`~.state.ServerOptions`) applies to the API operations (not to
``client/config``, heartbeats or telemetry): before a request is processed it may be throttled
(429, ``throttle_rate``) or fail (500, ``error_rate``); after it was processed its response may be
lost and replaced by a 500 (``lost_response_rate``) — the case that proves a resubmitted training
operation or sample is not executed twice. Injected errors carry ``retry-after-ms`` so the SDK's
retries are quick. Non-Tinker helper routes: ``GET /_rlkit/stats``, ``POST /_rlkit/config``.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from dataclasses import asdict, replace
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlparse

from rlkit.backends.http_service import BadRequestBody, LocalHTTPService, is_loopback, load_json
from rlkit.backends.stand_ins import InjectsFaults
from rlkit.backends.tinker.server import ops
from rlkit.backends.tinker.server.state import CALLER, ServerOptions, ServerState, TinkerError, bad_request, principal
from rlkit.errors import ConfigError, RlkitError

log = logging.getLogger("rlkit.tinker.server")

PROTO = "application/x-protobuf"
QUIET = {
    "/api/v1/client/config",
    "/api/v1/client/dynamic_config",
    "/api/v1/session_heartbeat",
    "/api/v1/telemetry",
    "/api/v1/healthz",
}
Handler = Callable[["TinkerServer", Dict[str, Any], Any], Any]
ROUTES: list = []


def route(method: str, pattern: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        ROUTES.append((method, re.compile(pattern), fn))
        return fn

    return register


class TinkerServer(InjectsFaults, LocalHTTPService):
    """A local server speaking Tinker's wire protocol, backed by rlkit's local engine.

    ``with TinkerServer().start() as server: os.environ.update(server.env())`` — or in the
    foreground with ``rlkit serve tinker --port N``."""

    thread_name = "rlkit-tinker-http"

    def __init__(self, options: Optional[ServerOptions] = None, **overrides: Any):
        self.options = replace(options or ServerOptions(), **overrides)
        self._keys = tuple(k for k in (self.options.api_key, *self.options.api_keys) if k)
        if any(not k.startswith("tml-") for k in self._keys):
            raise ConfigError("--api-key: Tinker API keys start with 'tml-' (the SDK refuses any other)")
        if self.options.max_batch_rows > 1 and self.options.max_num_samples > self.options.max_batch_rows // 2:
            log.warning(
                "--max-num-samples %d is over half of --max-batch-rows %d: one request at the cap can fill a decode "
                "batch, and other clients' samples then wait for it", self.options.max_num_samples, self.options.max_batch_rows,
            )
        self.init_faults()  # checked before the engine starts
        self.state = ServerState(self.options)

    # -- lifecycle (rlkit.backends.http_service) ---------------------------------------------------
    def bind(self, host: str = "127.0.0.1", port: int = 0) -> "TinkerServer":
        if not is_loopback(host) and not self._keys:
            raise ConfigError(
                f"--host {host}: a server beyond loopback needs an API key (--api-key tml-... or $RLKIT_TINKER_API_KEY)"
            )
        return super().bind(host, port)

    def body_limit(self) -> int:
        return self.options.max_body_bytes

    def http_error(self, status: int, message: str) -> Tuple[int, Dict[str, str], bytes]:
        return self._error(status, message)

    def close_state(self) -> None:
        self.state.close()

    def env(self) -> Dict[str, str]:
        """Environment variables that point the tinker SDK here."""
        return {"TINKER_BASE_URL": self.url, "TINKER_API_KEY": self._keys[0] if self._keys else "tml-local"}

    # -- one request --------------------------------------------------------------------------------
    def handle(
        self, method: str, raw_path: str, headers: Dict[str, str], body: bytes
    ) -> Tuple[int, Dict[str, str], bytes]:
        url = urlparse(raw_path)
        path = unquote(url.path)
        caller = None
        try:
            if self._keys:
                presented = headers.get("x-api-key", "")
                if not any(hmac.compare_digest(presented.encode(), k.encode()) for k in self._keys):
                    raise TinkerError(401, "missing or wrong API key (X-API-Key)")
                caller = principal(presented)
        except TinkerError as err:
            return self._error(err.status, err.message)
        token = CALLER.set(caller)  # what this request creates is the caller's; others' things are 404
        try:
            return self._handle(method, path, url, headers, body)
        finally:
            CALLER.reset(token)

    def _handle(self, method: str, path: str, url: Any, headers: Dict[str, str], body: bytes) -> Tuple[int, Dict[str, str], bytes]:
        try:
            if path.startswith("/_rlkit/"):
                return self._helper(method, path, body)
            fn, m = _route(method, path)
            faulty = path not in QUIET
            if faulty and self.options.latency_ms:
                time.sleep(self.options.latency_ms / 1000.0)
            lose = self._faults() if faulty else False
            request = {"match": m.groupdict(), "query": parse_qs(url.query), "headers": headers}
            payload = body if fn.__name__ == "forward_backward_route" else _json(body)
            result = fn(self, request, payload)
            if lose:
                self.state.stats["lost_responses"] += 1
                raise TinkerError(500, "injected fault: the response was lost after the request was processed")
        except TinkerError as err:
            return self._error(err.status, err.message)
        except (RlkitError, KeyError, TypeError, ValueError) as exc:
            text = f"missing field {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
            return self._error(400, text[:2000])
        except Exception as exc:  # noqa: BLE001 - a server bug still answers in the SDK's shape
            log.exception("error in %s %s", method, path)
            return self._error(500, f"{type(exc).__name__}: {exc}")
        if isinstance(result, tuple):  # (content type, bytes)
            return 200, {"Content-Type": result[0]}, result[1]
        return 200, {"Content-Type": "application/json"}, json.dumps(result).encode()

    def _faults(self) -> bool:
        return self.inject_faults(lambda: TinkerError(429, "rate limited (injected fault)"),
                                  lambda: TinkerError(500, "injected fault: internal error"))

    def _error(self, status: int, message: str) -> Tuple[int, Dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"}
        if status in (429, 500):
            headers["retry-after-ms"] = "20"
        elif status not in (408, 429):  # a client error is final: the SDK retries a 409 unless told not to
            headers["x-should-retry"] = "false"
        if status < 500 and status != 429:
            self.state.stats[f"errors:{status}"] += 1
        return status, headers, json.dumps({"detail": message, "error": message}).encode()

    def _helper(self, method: str, path: str, body: bytes) -> Tuple[int, Dict[str, str], bytes]:
        if path == "/_rlkit/stats":
            out: Dict[str, Any] = self.state.summary()
        elif path == "/_rlkit/config" and method == "POST":
            try:
                out = self.configure(**_json(body))
            except (ValueError, TypeError) as exc:
                return self._error(400, str(exc))
        elif path == "/_rlkit/config":
            out = {k: v for k, v in asdict(self.options).items() if k not in ("api_key", "api_keys")}
        else:
            return self._error(404, "unknown helper route")
        return 200, {"Content-Type": "application/json"}, json.dumps(out, default=str).encode()


def _route(method: str, path: str) -> Tuple[Handler, Any]:
    for verb, rx, fn in ROUTES:
        m = rx.fullmatch(path)
        if m and verb == method:
            return fn, m
    raise TinkerError(404, f"rlkit's Tinker server has no route {method} {path}")


def _json(body: bytes) -> Dict[str, Any]:
    try:
        return load_json(body)
    except BadRequestBody as err:
        raise TinkerError(err.status, str(err)) from None


# -- routes ---------------------------------------------------------------------------------------------


@route("POST", r"/api/v1/client/config")
def client_config(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "pjwt_auth_enabled": False,
        "credential_default_source": "api_key",
        "proto_compress_fwdbwd": False,
        "fwdbwd_max_chunk_len": server.options.fwdbwd_max_chunk_len,
        "sample_use_retrieve_futures": False,
        "custom_loss_server_side": False,
        "sample_join_sampling_session": False,
    }


@route("POST", r"/api/v1/client/dynamic_config")
def dynamic_config(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    # the SDK then sends cancel_future for a sample whose polling it abandoned (a timeout, a cancel)
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": True}


@route("GET", r"/api/v1/healthz")
def healthz(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    return {"status": "ok"}


@route("GET", r"/api/v1/get_server_capabilities")
def capabilities(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    names = sorted(ops.model_table(server.options.models))
    return {"supported_models": [{"model_name": n, "trainable": True, "sampleable": True} for n in names]}


@route("POST", r"/api/v1/telemetry")
def telemetry(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    return {"status": "accepted"}


@route("POST", r"/api/v1/create_session")
def create_session(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "create_session", "session_id": server.state.create_session(body).id}


@route("POST", r"/api/v1/session_heartbeat")
def heartbeat(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    session = server.state.session(body["session_id"])
    if session.finished:
        raise TinkerError(410, f"session {session.id} has finished")
    session.last_heartbeat = time.time()
    return {"type": "session_heartbeat"}


@route("POST", r"/api/v1/sessions/(?P<session>[^/]+)/finish")
def finish_session(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    reason = body.get("reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    server.state.finish_session(req["match"]["session"], kind if isinstance(kind, str) and kind else "success")
    return {}


@route("GET", r"/api/v1/sessions/(?P<session>[^/]+)")
def get_session(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    s = server.state.session(req["match"]["session"])
    return {
        "training_run_ids": list(s.runs),
        "sampler_ids": list(s.samplers),
        "user_metadata": s.user_metadata or None,
        "display_name": s.display_name,
    }


@route("GET", r"/api/v1/sessions")
def list_sessions(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    with server.state.lock:
        mine = [s for s in server.state.sessions.values() if server.state.visible(s.owner)]
    return {"sessions": [s.id for s in sorted(mine, key=lambda s: -s.created)]}


@route("POST", r"/api/v1/forward_backward")
def forward_backward_route(server: TinkerServer, req: Dict[str, Any], body: bytes) -> Dict[str, Any]:
    if PROTO not in req["headers"].get("content-type", ""):
        raise bad_request(f"forward_backward takes {PROTO} (a ForwardBackwardRequest protobuf)")
    return ops.forward_backward(server.state, body)


@route("POST", r"/api/v1/save_weights_external")
def save_weights_external(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    raise bad_request(
        "save_weights_external is not supported; checkpoints are PEFT adapter directories "
        "under the server's --state-dir"
    )


@route("GET", r"/api/v1/samplers/(?P<sampler>.+)")
def get_sampler(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    return ops.get_sampler(server.state, req["match"]["sampler"])


@route("POST", r"/api/v1/retrieve_future")
def retrieve_future(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Any:
    """Long-poll: answer when the result is ready, or ``try_again`` after ``long_poll_s``."""
    future = server.state.future(body["request_id"])
    if not future.done.wait(server.options.long_poll_s):
        return {"type": "try_again", "request_id": future.request_id, "queue_state": "active"}
    if future.error is not None:
        return {"error": future.error, "category": future.category}
    if isinstance(future.payload, bytes):
        return PROTO, future.payload
    return future.payload


@route("POST", r"/api/v1/cancel_future")
def cancel_future(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
    """Stop a running sample (the SDK's cancel of an abandoned sampling future): its future fails,
    its rows leave the decode at the next step. Anything else (finished, unknown, another key's,
    a training operation, which runs in order) is left alone, with the same empty answer."""
    state = server.state
    if state.inflight.cancel(str(body.get("request_id")), "sample: cancelled by its client (cancel_future)", owner=state.caller()):
        state.stats["samples_cancelled"] += 1
    return {}


@route("GET", r"/api/v1/training_runs")
def list_training_runs(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    q = req["query"]
    limit, offset = int((q.get("limit") or ["20"])[0]), int((q.get("offset") or ["0"])[0])
    state = server.state
    with state.lock:
        runs = [m for m, r in state.runs.items() if state.visible(r.owner)]
        ids = list(dict.fromkeys([*runs, *(c.model_id for c in state.checkpoints.values() if state.visible(c.owner))]))
    rows = [ops.training_run(server.state, i) for i in ids]
    return {
        "training_runs": rows[offset : offset + limit],
        "cursor": {"offset": offset, "limit": limit, "total_count": len(rows)},
    }


@route("GET", r"/api/v1/training_runs/(?P<run>[^/]+)")
def get_training_run(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    return ops.training_run(server.state, req["match"]["run"])


@route("GET", r"/api/v1/training_runs/(?P<run>[^/]+)/checkpoints")
def list_checkpoints(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    return {"checkpoints": [c.wire() for c in server.state.checkpoints_of(req["match"]["run"])]}


@route(
    "DELETE", r"/api/v1/training_runs/(?P<run>[^/]+)/checkpoints/(?P<segment>weights|sampler_weights)/(?P<name>[^/]+)"
)
def delete_checkpoint(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    m = req["match"]
    server.state.delete_checkpoint(f"tinker://{m['run']}/{m['segment']}/{m['name']}")
    return {}


@route("GET", r"/api/v1/checkpoints")
def list_user_checkpoints(server: TinkerServer, req: Dict[str, Any], body: Any) -> Dict[str, Any]:
    with server.state.lock:
        rows = sorted((c for c in server.state.checkpoints.values() if server.state.visible(c.owner)), key=lambda c: -c.created)
    return {"checkpoints": [c.wire() for c in rows]}


def _relay(name: str) -> Handler:
    """A route whose JSON body goes to ``ops.<name>(state, body)`` unchanged."""
    operation = getattr(ops, name)

    def handler(server: TinkerServer, req: Dict[str, Any], body: Dict[str, Any]) -> Dict[str, Any]:
        return operation(server.state, body)

    handler.__name__ = name
    return handler


#: POST routes that are the operation of the same name in :mod:`.ops`
RELAYED = ("create_model", "get_info", "optim_step", "save_weights", "save_weights_for_sampler", "load_weights",
           "create_sampling_session", "asample", "weights_info")
for _name in RELAYED:
    route("POST", rf"/api/v1/{_name}")(_relay(_name))
