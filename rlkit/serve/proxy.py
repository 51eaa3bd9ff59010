"""Proxy mode: the same OpenAI routes, forwarded to a SageMaker training session.

A SageMaker training session offers a chat pass-through, ``SampleTrainingSession`` (``POST
/training-sessions/{name}/sample`` on the ``sagemakertrainingsessionruntime`` API): its body goes
to the session's model container, which speaks the chat-completions format. :class:`SageMakerProxy`
sends each validated request there through botocore — so it is SigV4-signed with the default AWS
credential chain, retried on throttling, and pointed at ``--endpoint-url`` /
``$SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT`` when set (the emulator:
``rlkit emulate sagemaker``) — and hands the reply back in OpenAI's full shape. A plain OpenAI client
(Python or Node) then talks to a SageMaker session.

What is forwarded: ``messages`` (roles normalised), ``max_tokens``, ``temperature``, ``top_p``,
``top_k``, ``stop``, ``seed``, ``n``, ``logprobs``/``top_logprobs`` — whatever the client gave. The
proxy does not repair what the container does with them; ``rlkit endpoint check`` against the
proxy measures exactly that. ``stream: true`` is served as server-sent events synthesised from the
whole reply (one content chunk per choice). AWS errors map to OpenAI bodies: ValidationException
-> 400, ResourceNotFoundException -> 404, ThrottlingException -> 429, anything else (including the
proxy's own credentials being refused) -> 502.

Needs botocore (the ``sagemaker`` extra).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from rlkit.serve.protocol import APIError, ChatRequest, bad_request, chunk_body, new_id, usage_body
from rlkit.serve.sources import ModelSource, Snapshot

RUNTIME_SERVICE = "sagemakertrainingsessionruntime"
ENDPOINT_ENV = "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT"


@dataclass
class ProxyCompletion:
    """An upstream reply, shaped like :class:`~rlkit.serve.completions.Completion`."""

    reply: Dict[str, Any]
    model: str
    snapshot: Snapshot
    request: ChatRequest

    def __post_init__(self) -> None:
        self.id = self.reply.get("id") if isinstance(self.reply.get("id"), str) else new_id()
        self.created = int(self.reply.get("created") or time.time())
        self.choices = []
        for i, c in enumerate(self.reply.get("choices") or []):
            message = c.get("message") or {}
            self.choices.append(
                {
                    "index": c.get("index", i),
                    "message": {"role": message.get("role", "assistant"), "content": message.get("content") or "", "refusal": None},
                    "logprobs": c.get("logprobs"),
                    "finish_reason": c.get("finish_reason") or "stop",
                }
            )
        usage = self.reply.get("usage") or {}
        self.usage = usage_body(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))

    def body(self) -> Dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.snapshot.fingerprint,
            "choices": self.choices,
            "usage": self.usage,
        }

    def chunks(self) -> List[Dict[str, Any]]:
        common = dict(id=self.id, model=self.model, created=self.created, fingerprint=self.snapshot.fingerprint)
        extra = {"usage": None} if self.request.include_usage else {}
        out = []
        for c in self.choices:
            i = c["index"]
            for delta, lp, finish in (({"role": "assistant", "content": ""}, None, None), ({"content": c["message"]["content"]}, c["logprobs"], None), ({}, None, c["finish_reason"])):
                out.append({**chunk_body(choices=[{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}], **common), **extra})
        if self.request.include_usage:
            out.append(chunk_body(choices=[], usage=self.usage, **common))
        return out


def upstream_body(req: ChatRequest) -> Dict[str, Any]:
    """The chat-completions body sent to the session's model container (which takes no tools)."""
    if req.uses_tools:
        raise bad_request("Tools ('tools', tool calls and 'tool' messages) are not supported when serving a SageMaker "
                          "session: its model container renders plain chat only.", "tools", "unsupported_parameter")
    if req.response_format is not None:
        raise bad_request("'response_format' (constrained decoding) is not supported when serving a SageMaker session: "
                          "its model container has no constrained decoding.", "response_format", "unsupported_parameter")
    body: Dict[str, Any] = {"messages": req.messages}
    for key in ("max_tokens", "temperature", "top_p", "top_k", "seed"):
        value = getattr(req, key)
        if value is not None:
            body[key] = value
    if req.stop:
        body["stop"] = req.stop
    if req.n != 1:
        body["n"] = req.n
    if req.logprobs:
        body["logprobs"] = True
        if req.top_logprobs:
            body["top_logprobs"] = req.top_logprobs
    return body


class SageMakerProxy(ModelSource):
    """Serves a SageMaker training session (its base weights, or ``model_package_arn``)."""

    def __init__(
        self,
        session_name: str,
        *,
        region: Optional[str] = None,
        endpoint_url: Optional[str] = None,
        model_package_arn: Optional[str] = None,
        name: Optional[str] = None,
        max_concurrency: int = 64,
        client: Any = None,
    ):
        self.session_name = session_name
        self.name = name or session_name
        self.aliases = [session_name]
        self.model_package_arn = model_package_arn or None
        self._snapshot = Snapshot(None, f"sagemaker:{session_name}", model_package_arn or "")
        self._client = client or self._make_client(region, endpoint_url, max_concurrency)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="rlkit-serve-proxy")

    @staticmethod
    def _make_client(region: Optional[str], endpoint_url: Optional[str], max_concurrency: int) -> Any:
        from rlkit.errors import BackendUnavailableError

        try:
            import botocore.session
            from botocore.config import Config
        except ImportError:
            raise BackendUnavailableError("the SageMaker proxy needs botocore: pip install 'rlkit[sagemaker]'") from None
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if not region:
            from rlkit.errors import ConfigError

            raise ConfigError("the SageMaker proxy needs a region: --region or $AWS_REGION")
        config = Config(retries={"mode": "standard", "max_attempts": 4}, max_pool_connections=max_concurrency, read_timeout=600)
        return botocore.session.get_session().create_client(
            RUNTIME_SERVICE, region_name=region, endpoint_url=endpoint_url or os.environ.get(ENDPOINT_ENV) or None, config=config
        )

    def current(self) -> Snapshot:
        return self._snapshot

    def _call(self, body: Dict[str, Any]) -> Dict[str, Any]:
        kwargs: Dict[str, Any] = {
            "trainingSessionName": self.session_name,
            "body": json.dumps(body).encode(),
            "contentType": "application/json",
            "accept": "application/json",
        }
        if self.model_package_arn:
            kwargs["modelPackageArn"] = self.model_package_arn
        out = self._client.sample_training_session(**kwargs)
        raw = out["body"].read()
        try:
            reply = json.loads(raw)
        except ValueError:
            raise APIError(502, f"SageMaker session {self.session_name} answered with a body that is not JSON: {raw[:200]!r}", type="server_error") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("choices"), list):
            raise APIError(502, f"SageMaker session {self.session_name} answered without a 'choices' list: {str(reply)[:200]}", type="server_error")
        return reply

    async def complete(self, req: ChatRequest) -> ProxyCompletion:
        if not self.accepts(req.model):
            raise APIError(404, f"The model '{req.model}' does not exist; this server serves '{self.name}'.", param="model", code="model_not_found")
        loop = asyncio.get_running_loop()
        try:
            reply = await loop.run_in_executor(self._pool, self._call, upstream_body(req))
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - botocore errors, mapped below
            raise translate_error(exc, self.session_name) from None
        return ProxyCompletion(reply, self.name, self._snapshot, req)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def translate_error(exc: BaseException, session: str) -> APIError:
    """A botocore failure as an OpenAI-shaped :class:`APIError`."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        code = response["Error"].get("Code") or "Unknown"
        message = " ".join(str(response["Error"].get("Message") or exc).split())
        if code == "ValidationException":
            return APIError(400, f"SageMaker refused the request: {message}", code="upstream_validation")
        if code == "ResourceNotFoundException":
            return APIError(404, f"SageMaker: {message}", code="session_not_found")
        if code == "ThrottlingException":
            return APIError(429, f"SageMaker throttled the request: {message}", type="rate_limit_error", code="rate_limit_exceeded")
        return APIError(502, f"SageMaker session {session} failed ({code}): {message}", type="server_error", code="upstream_error")
    return APIError(502, f"cannot reach SageMaker session {session}: {type(exc).__name__}: {exc}", type="server_error", code="upstream_unreachable")
