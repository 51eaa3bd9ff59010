"""The emulator's HTTP server: one port serves both planes, as the real SDK sees them.

- control plane: ``POST /`` with ``X-Amz-Target: SageMaker.<Operation>`` and an
  ``application/x-amz-json-1.1`` body (botocore's ``json`` protocol);
- runtime: the ``rest-json`` routes of ``sagemakertrainingsessionruntime`` —
  ``POST|GET /v1/training-sessions/{name}/operations[/{id}]``,
  ``POST|GET /v1/training-sessions/{name}/sampling-operations[/{id}]``,
  ``POST /training-sessions/{name}/sample``.

Point the SDK at it with ``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` and
``SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT`` (both the server's URL) and any credentials:
requests must carry a SigV4 ``Authorization`` header. With ``access_key_id`` it must name that key
(403 otherwise); with ``secret_access_key`` too, its signature is recomputed and checked
(:mod:`.sigv4`: 403 ``InvalidSignatureException`` for another secret, a changed request or a date
more than 15 minutes off). Beyond loopback both are required.

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

import hmac
import json
import logging
import re
import time
import uuid
from dataclasses import asdict, replace
from typing import Any, Dict, Optional, Tuple
from urllib.parse import unquote, urlparse

from rlkit.backends.http_service import BadRequestBody, LocalHTTPService, is_loopback, load_json
from rlkit.backends.sagemaker.emulator import sigv4
from rlkit.backends.sagemaker.emulator.control import ControlPlane
from rlkit.backends.sagemaker.names import EMULATOR_HANDSHAKE
from rlkit.backends.sagemaker.emulator.runtime import Runtime
from rlkit.backends.sagemaker.emulator.shapes import CONTROL_SERVICE, RUNTIME_SERVICE, ServiceError, Validator
from rlkit.backends.sagemaker.emulator.state import EmulatorOptions, EmulatorState
from rlkit.backends.stand_ins import InjectsFaults
from rlkit.errors import ConfigError

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


class Emulator(InjectsFaults, LocalHTTPService):
    """A local server speaking the SageMaker training-session wire protocol.

    ``with Emulator(options).start() as emu: os.environ.update(emu.env())`` — or run it in the
    foreground with ``rlkit emulate sagemaker --port N``."""

    thread_name = "rlkit-emulator-http"

    def __init__(self, options: Optional[EmulatorOptions] = None, **overrides: Any):
        self.options = replace(options or EmulatorOptions(), **overrides)
        if self.options.secret_access_key and not self.options.access_key_id:
            raise ConfigError("--secret-access-key needs --access-key-id (the key whose signatures it verifies)")
        self.init_faults()  # checked before the engine starts
        self.state = EmulatorState(self.options)
        self.control = ControlPlane(self.state)
        self.runtime = Runtime(self.state)
        self._control_validator = Validator(CONTROL_SERVICE)
        self._runtime_validator = Validator(RUNTIME_SERVICE)

    # -- lifecycle (rlkit.backends.http_service) ---------------------------------------------------
    def bind(self, host: str = "127.0.0.1", port: int = 0) -> "Emulator":
        """Loopback only, unless ``allow_remote`` and an ``access_key_id`` (then every request must
        be signed with that key): the emulator trains and samples for whoever reaches it."""
        if not is_loopback(host):
            if not self.options.allow_remote:
                raise ConfigError(f"--host {host}: the emulator listens beyond loopback only with --allow-remote and --access-key-id")
            if not self.options.access_key_id or not self.options.secret_access_key or not self.options.require_auth:
                raise ConfigError(
                    f"--host {host}: beyond loopback the emulator needs --access-key-id and --secret-access-key "
                    "(or $RLKIT_EMULATOR_SECRET_ACCESS_KEY), and auth on"
                )
        return super().bind(host, port)

    def body_limit(self) -> int:
        return self.options.request_limit or self.max_body_bytes

    def http_error(self, status: int, message: str) -> Tuple[int, Dict[str, str], bytes]:
        if status == 413:
            self.state.stats["requests_too_large"] += 1
        return self._error("runtime", ServiceError("ValidationException", message[:1].upper() + message[1:], status))

    def close_state(self) -> None:
        self.state.close()

    def env(self) -> Dict[str, str]:
        """Environment variables that point the SDK (and rlkit's adapter) here."""
        return {
            "SAGEMAKER_TRAINING_SESSION_ENDPOINT": self.url,
            "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": self.url,
            "AWS_REGION": self.options.region,
        }

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
            auth = headers.get("authorization", "")
            if self.options.require_auth and not auth.startswith("AWS4-HMAC-SHA256"):
                raise ServiceError("MissingAuthenticationTokenException", "Missing Authentication Token")
            key = self.options.access_key_id
            if key and not hmac.compare_digest(_credential(auth).encode(), key.encode()):
                raise ServiceError("UnrecognizedClientException", "The security token included in the request is invalid", 403)
            if self.options.secret_access_key:
                sigv4.verify(method, raw_path, headers, body, self.options.secret_access_key)
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
        return self.inject_faults(lambda: ServiceError("ThrottlingException", "Rate exceeded (injected fault)"),
                                  lambda: self._server_error(plane, "Injected fault: internal error"))

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
            out = {k: v for k, v in asdict(self.options).items() if k != "secret_access_key"}
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
    try:
        return load_json(body)
    except BadRequestBody as err:
        raise ServiceError("SerializationException", str(err), err.status) from None


def _credential(auth: str) -> str:
    """The access key id a SigV4 ``Authorization`` header names (``Credential=AKID/date/...``)."""
    m = re.search(r"Credential=([^/,\s]+)/", auth)
    return m.group(1) if m else ""

