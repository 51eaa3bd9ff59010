"""The emulator's HTTP server: one port serves both planes, as the real SDK sees them.

- control plane: ``POST /`` with ``X-Amz-Target: SageMaker.<Operation>`` and an
  ``application/x-amz-json-1.1`` body (botocore's ``json`` protocol);
- runtime: the ``rest-json`` routes of ``sagemakertrainingsessionruntime`` —
  ``POST|GET /v1/training-sessions/{name}/operations[/{id}]``,
  ``POST|GET /v1/training-sessions/{name}/sampling-operations[/{id}]``,
  ``POST /training-sessions/{name}/sample``.

Point the SDK at it with ``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` and
``SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT`` (both the server's URL) and any credentials:
requests must carry a SigV4 ``Authorization`` header, which is not verified.

Errors come back in AWS's shape: ``{"__type": code, "message": ...}`` with the code's HTTP status
(runtime: 400 ValidationException, 404 ResourceNotFoundException, 409 ConflictException, 429
ThrottlingException, 500 InternalServerException; control plane: 400 for client errors, 500
InternalFailure), plus ``x-amzn-ErrorType`` on the runtime.

Fault injection (:class:`~.state.EmulatorOptions`): before a runtime request is processed it may
be throttled (``throttle_rate``) or fail with a 5xx (``error_rate``); after it was processed its
response may be lost and replaced by a 5xx (``lost_response_rate``) — the case that proves a
retried ``ExecuteTrainingOperation`` is not executed twice. ``latency_ms`` delays every request.
Non-AWS helper routes: ``GET /_emulator/stats``, ``POST /_emulator/config`` (change fault options
at run time), ``GET /_emulator/health``.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
import uuid
from dataclasses import asdict, replace
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, Optional, Tuple
from urllib.parse import unquote, urlparse

from rlkit.backends.http_service import LocalHTTPService
from rlkit.backends.sagemaker.emulator.control import ControlPlane
from rlkit.backends.sagemaker.names import EMULATOR_HANDSHAKE
from rlkit.backends.sagemaker.emulator.runtime import Runtime
from rlkit.backends.sagemaker.emulator.shapes import CONTROL_SERVICE, RUNTIME_SERVICE, ServiceError, Validator
from rlkit.backends.sagemaker.emulator.state import EmulatorOptions, EmulatorState

log = logging.getLogger("rlkit.emulator")

_NAME = r"(?P<name>[^/]+)"
_ID = r"(?P<op>[^/]+)"
ROUTES = [
    ("POST", re.compile(rf"/v1/training-sessions/{_NAME}/operations"), "ExecuteTrainingOperation"),
    ("GET", re.compile(rf"/v1/training-sessions/{_NAME}/operations/{_ID}"), "GetTrainingOperationResult"),
    ("POST", re.compile(rf"/v1/training-sessions/{_NAME}/sampling-operations"), "ExecuteSamplingOperation"),
    ("GET", re.compile(rf"/v1/training-sessions/{_NAME}/sampling-operations/{_ID}"), "GetSamplingOperationResult"),
    ("POST", re.compile(rf"/training-sessions/{_NAME}/sample"), "SampleTrainingSession"),
    ("POST", re.compile(rf"/training-sessions/{_NAME}/sample-with-response-stream"), "SampleTrainingSessionWithResponseStream"),
]
JSON11 = "application/x-amz-json-1.1"
#: ``GET /_emulator/health`` answers ``{"emulator": HANDSHAKE, ...}``: how a client tells this
#: emulator from a real endpoint (a VPC endpoint URL in ``SAGEMAKER_TRAINING_SESSION_ENDPOINT``).
HANDSHAKE = EMULATOR_HANDSHAKE


class Emulator(LocalHTTPService):
    """A local server speaking the SageMaker training-session wire protocol.

    ``with Emulator(options).start() as emu: os.environ.update(emu.env())`` — or run it in the
    foreground with ``rlkit emulate sagemaker --port N``."""

    thread_name = "rlkit-emulator-http"

    def __init__(self, options: Optional[EmulatorOptions] = None, **overrides: Any):
        self.options = replace(options or EmulatorOptions(), **overrides)
        self.state = EmulatorState(self.options)
        self.control = ControlPlane(self.state)
        self.runtime = Runtime(self.state)
        self._control_validator = Validator(CONTROL_SERVICE)
        self._runtime_validator = Validator(RUNTIME_SERVICE)
        self._rng = random.Random(self.options.fault_seed)
        self._rng_lock = threading.Lock()

    # -- lifecycle (rlkit.backends.http_service) ---------------------------------------------------
    def handler_class(self) -> type:
        class Handler(_Handler):
            emulator = self

        return Handler

    def close_state(self) -> None:
        self.state.close()

    def env(self) -> Dict[str, str]:
        """Environment variables that point the SDK (and rlkit's adapter) here."""
        return {
            "SAGEMAKER_TRAINING_SESSION_ENDPOINT": self.url,
            "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": self.url,
            "AWS_REGION": self.options.region,
        }

    def configure(self, **changes: Any) -> Dict[str, Any]:
        """Change fault-injection options while serving."""
        unknown = sorted(set(changes) - set(EmulatorOptions.FAULT_FIELDS))
        if unknown:
            raise ValueError(f"not fault options: {unknown}; allowed: {list(EmulatorOptions.FAULT_FIELDS)}")
        for key, value in changes.items():
            if key in ("error_ops", "lost_response_ops"):
                value = {str(k): int(v) for k, v in dict(value or {}).items()}
            setattr(self.options, key, value)
        if "fault_seed" in changes:
            with self._rng_lock:
                self._rng = random.Random(self.options.fault_seed)
        return {k: getattr(self.options, k) for k in EmulatorOptions.FAULT_FIELDS}

    # -- one request ------------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers: Dict[str, str], body: bytes) -> Tuple[int, Dict[str, str], bytes]:
        path = unquote(urlparse(raw_path).path)
        if path.startswith("/_emulator/"):
            return self._helper(method, path, body)
        target = headers.get("x-amz-target", "")
        if method == "POST" and path == "/" and target.startswith("SageMaker."):
            plane, operation, match = "control", target.split(".", 1)[1], None
        else:
            plane, operation, match = "runtime", None, None
            for verb, rx, op in ROUTES:
                m = rx.fullmatch(path)
                if m and verb == method:
                    operation, match = op, m
                    break
            if operation is None:
                return self._error("runtime", ServiceError("UnknownOperationException", f"No route for {method} {path}", 404))
        self.state.stats[f"requests:{operation}"] += 1
        try:
            if self.options.require_auth and not headers.get("authorization", "").startswith("AWS4-HMAC-SHA256"):
                raise ServiceError("MissingAuthenticationTokenException", "Missing Authentication Token")
            if self.options.latency_ms:
                time.sleep(self.options.latency_ms / 1000.0)
            lose = self._faults(plane, operation)
            limit = self.options.request_limit
            if plane == "runtime":
                self.state.stats["largest_request_bytes"] = max(self.state.stats["largest_request_bytes"], len(body))
            if plane == "runtime" and limit is not None and len(body) > limit:
                self.state.stats["requests_too_large"] += 1
                raise ServiceError("ValidationException", f"The request body is {len(body)} bytes, over the {limit}-byte limit of the runtime API", 413)
            if plane == "control":
                result = self._control(operation, body)
                payload = json.dumps(result).encode()
                content_type = JSON11
            else:
                status, content_type, payload = self._runtime(operation, match, headers, body)
            if lose:
                self.state.stats["lost_responses"] += 1
                raise self._server_error(plane, "Injected fault: the response was lost after the request was processed")
        except ServiceError as err:
            return self._error(plane, err)
        except Exception as exc:  # noqa: BLE001 - an emulator bug must still answer in AWS's shape
            log.exception("emulator error in %s", operation)
            return self._error(plane, self._server_error(plane, f"{type(exc).__name__}: {exc}"))
        return 200, {"Content-Type": content_type, "x-amzn-RequestId": str(uuid.uuid4())}, payload

    def _faults(self, plane: str, operation: str) -> bool:
        """Raise an injected fault for this request, or return whether to lose its response."""
        opts = self.options
        with self._rng_lock:
            if opts.error_ops.get(operation, 0) > 0:
                opts.error_ops[operation] -= 1
                self.state.stats["server_errors"] += 1
                raise self._server_error(plane, f"Injected fault: internal error in {operation}")
            if opts.lost_response_ops.get(operation, 0) > 0:
                opts.lost_response_ops[operation] -= 1
                return True
        if plane == "control" and not opts.control_plane_faults:
            return False
        with self._rng_lock:
            a, b = self._rng.random(), self._rng.random()
        if a < opts.throttle_rate:
            self.state.stats["throttled"] += 1
            raise ServiceError("ThrottlingException", "Rate exceeded (injected fault)")
        if a < opts.throttle_rate + opts.error_rate:
            self.state.stats["server_errors"] += 1
            raise self._server_error(plane, "Injected fault: internal error")
        return b < opts.lost_response_rate

    @staticmethod
    def _server_error(plane: str, message: str) -> ServiceError:
        return ServiceError("InternalServerException" if plane == "runtime" else "InternalFailure", message, 500)

    def _control(self, operation: str, body: bytes) -> Dict[str, Any]:
        params = _json(body)
        self._control_validator.validate(operation, params)
        return self.control.handle(operation, params)

    def _runtime(self, operation: str, match: Any, headers: Dict[str, str], body: bytes) -> Tuple[int, str, bytes]:
        name = match.group("name")
        if operation == "SampleTrainingSessionWithResponseStream":
            raise ServiceError("ValidationException", "The emulator does not implement SampleTrainingSessionWithResponseStream; use SampleTrainingSession")
        if operation == "SampleTrainingSession":
            self._runtime_validator.validate(operation, {"trainingSessionName": name})
            out = self.runtime.sample_chat(name, body, headers.get("x-amzn-sagemaker-model-package"))
            return 200, "application/json", json.dumps(out).encode()
        params = _json(body) if body else {}
        params["trainingSessionName"] = name
        if "op" in match.groupdict():
            params["operationId"] = match.group("op")
        self._runtime_validator.validate(operation, params)
        if operation == "ExecuteTrainingOperation":
            out = self.runtime.execute_training(name, params)
        elif operation == "GetTrainingOperationResult":
            out = self.runtime.get_training(name, params["operationId"])
        elif operation == "ExecuteSamplingOperation":
            out = self.runtime.execute_sampling(name, params)
        else:
            out = self.runtime.get_sampling(name, params["operationId"])
        return 200, "application/json", json.dumps(out).encode()

    def _helper(self, method: str, path: str, body: bytes) -> Tuple[int, Dict[str, str], bytes]:
        if path == "/_emulator/health":  # the handshake rlkit's adapter recognises the emulator by
            out: Dict[str, Any] = {"ok": True, "emulator": HANDSHAKE, "strict": self.options.strict, "cadence": self.options.pace}
        elif path == "/_emulator/stats":
            out = self.state.summary()
        elif path == "/_emulator/config" and method == "POST":
            try:
                out = self.configure(**_json(body))
            except (ValueError, TypeError, ServiceError) as exc:
                return 400, {"Content-Type": "application/json"}, json.dumps({"message": str(exc)}).encode()
        elif path == "/_emulator/config":
            out = asdict(self.options)
        else:
            return 404, {"Content-Type": "application/json"}, b'{"message": "unknown emulator route"}'
        return 200, {"Content-Type": "application/json"}, json.dumps(out, default=str).encode()

    def _error(self, plane: str, err: ServiceError) -> Tuple[int, Dict[str, str], bytes]:
        status = err.http_status(plane)
        headers = {"Content-Type": JSON11 if plane == "control" else "application/json", "x-amzn-RequestId": str(uuid.uuid4())}
        if plane == "runtime":
            headers["x-amzn-ErrorType"] = err.code
        if err.code not in ("ThrottlingException",) and status < 500:
            self.state.stats[f"errors:{err.code}"] += 1
        return status, headers, json.dumps({"__type": err.code, "message": err.message}).encode()


def _json(body: bytes) -> Dict[str, Any]:
    if not body:
        return {}
    try:
        value = json.loads(body)
    except ValueError:
        raise ServiceError("SerializationException", "The request body is not valid JSON") from None
    if not isinstance(value, dict):
        raise ServiceError("SerializationException", "The request body must be a JSON object")
    return value


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY: headers and body are two writes; without it a keep-alive client waits ~40 ms (delayed ACK)
    emulator: Emulator

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, out_headers, payload = self.emulator.handle(self.command, self.path, headers, body)
        self.send_response(status)
        for key, value in out_headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        log.debug("%s - %s", self.address_string(), format % args)
