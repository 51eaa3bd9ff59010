"""One vLLM OpenAI-compatible server, spoken to over HTTP with the standard library.

Only documented endpoints of ``vllm serve`` are used:

- ``POST /v1/completions`` with ``prompt`` a list of token ids, ``n``, ``logprobs`` and
  ``return_tokens_as_token_ids`` (sampled token ids come back exact, as ``"token_id:<id>"``), and
  vLLM's extra parameters ``prompt_logprobs``, ``stop_token_ids``, ``ignore_eos``, ``top_k``,
  ``skip_special_tokens``, ``return_token_ids``;
- ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter`` (runtime LoRA updating:
  the server runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and ``--enable-lora``);
- ``GET /health`` and ``GET /v1/models``.

A server that cannot be reached or answers with an error raises one line naming the server (and
its log, for a server rlkit started): :class:`~rlkit.errors.BackendUnavailableError` when it is
gone or failed (HTTP 5xx: a crashed engine answers 500 from then on), :class:`~rlkit.errors.OperationError`
when it refused the request (HTTP 4xx).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

from rlkit.errors import BackendUnavailableError, OperationError


RESUME = "the run stops here and resumes from its last checkpoint when started again with the same run directory"


class VllmServer:
    """One server: its base URL, the requests in flight on it (for least-loaded routing) and the
    adapters it has loaded."""

    def __init__(self, url: str, *, timeout_s: float = 600.0, log_path: Optional[str] = None):
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[: -len("/v1")]
        self.timeout_s = timeout_s
        self.log_path = log_path
        self.in_flight = 0  # requests sent and not yet answered (guarded by the pool's lock)
        self.adapters: Dict[str, str] = {}  # adapter name -> path the server loaded it from
        self.lock = threading.Lock()  # serialises adapter loads/unloads on this server

    def __repr__(self) -> str:
        return f"VllmServer({self.url!r})"

    def where(self) -> str:
        return f"vLLM server {self.url}" + (f" (its log: {self.log_path})" if self.log_path else "")

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, *, timeout_s: Optional[float] = None) -> Any:
        """The decoded JSON answer (or text) of ``method path`` with JSON ``body``, or one line."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            if exc.code >= 500:  # the server failed (a dead engine core answers 500 to everything after)
                raise BackendUnavailableError(f"{self.where()} failed {method} {path}: HTTP {exc.code}: {detail}; {RESUME}") from None
            raise OperationError(f"{self.where()} refused {method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BackendUnavailableError(f"{self.where()} is unreachable during {method} {path} ({reason}); {RESUME}") from None
        text = raw.decode("utf-8", errors="replace")
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return text

    # -- endpoints --------------------------------------------------------------------------------
    def healthy(self, timeout_s: float = 5.0) -> bool:
        try:
            self.request("GET", "/health", timeout_s=timeout_s)
            return True
        except (BackendUnavailableError, OperationError):
            return False

    def models(self) -> List[Dict[str, Any]]:
        answer = self.request("GET", "/v1/models", timeout_s=30.0)
        return list((answer or {}).get("data", []))

    def completions(self, body: Dict[str, Any]) -> Dict[str, Any]:
        answer = self.request("POST", "/v1/completions", body)
        if not isinstance(answer, dict) or "choices" not in answer:
            raise OperationError(f"{self.where()} answered /v1/completions without choices: {str(answer)[:200]}")
        return answer

    def load_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter at ``path`` (as the server sees it) under ``name``; idempotent."""
        with self.lock:
            if self.adapters.get(name) == path:
                return
            self.request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, timeout_s=300.0)
            self.adapters[name] = path

    def unload_adapter(self, name: str) -> None:
        with self.lock:
            if name not in self.adapters:
                return
            self.adapters.pop(name)
            self.request("POST", "/v1/unload_lora_adapter", {"lora_name": name}, timeout_s=60.0)


def _error_detail(exc: "urllib.error.HTTPError") -> str:
    try:
        body = exc.read().decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001 - the status code alone still says enough
        return exc.reason or ""
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict):
            err = parsed.get("error", parsed)
            message = err.get("message") if isinstance(err, dict) else err
            return " ".join(str(message or parsed.get("detail") or body).split())[:300]
    except json.JSONDecodeError:
        pass
    return " ".join(body.split())[:300]
