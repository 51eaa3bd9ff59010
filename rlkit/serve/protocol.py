"""The OpenAI chat-completions wire format: request validation, error bodies, response shapes.

Validation is strict in the way a portable client needs: a parameter rlkit honours is checked for
type and range and used; a parameter it does not implement (penalties, ``logit_bias``, ...) is
accepted only at its neutral value and refused with a
400 naming it otherwise — never silently ignored; an unknown parameter is refused like OpenAI
refuses it ("Unrecognized request argument supplied"). Limits (``n``, ``max_tokens``, stop
sequences, top logprobs) are the server's :class:`Limits`. Tools (``tools``, ``tool_choice``,
``parallel_tool_calls``, assistant ``tool_calls``, ``tool`` messages) are :mod:`rlkit.serve.tools`.
``response_format`` (``text``, ``json_object``, ``json_schema``) is honoured by constrained decoding
(:mod:`rlkit.constraints`): a schema that cannot be compiled is a 400 naming where in it.

Errors are :class:`APIError`; :meth:`APIError.body` is OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from rlkit.serve.tools import ToolParamError, check_forced_tools, parse_tool_choice, parse_tools, schema_error, tool_message_fields


class APIError(Exception):
    """An error answered to the client with ``status`` and an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class Limits:
    """What one request may ask for."""

    max_tokens: int = 2048  # the largest max_tokens / max_completion_tokens accepted
    default_max_tokens: int = 256  # used when the request gives none (capped by the context window)
    max_n: int = 16
    max_stop: int = 4  # as OpenAI
    max_top_logprobs: int = 20  # as OpenAI
    max_request_bytes: int = 1 << 20
    max_messages: int = 1024


@dataclass
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body."""

    model: str
    messages: List[Dict[str, str]]
    n: int = 1
    max_tokens: Optional[int] = None  # None: the server's default
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    stop: List[str] = field(default_factory=list)
    seed: Optional[int] = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    tools: List[Dict[str, Any]] = field(default_factory=list)  # OpenAI function tools
    tool_choice: Any = "none"  # none | auto | required | a function name
    parallel_tool_calls: bool = True
    response_format: Optional[Dict[str, Any]] = None  # the JSON schema the content must fit (None: text)

    @property
    def uses_tools(self) -> bool:
        """Whether the request renders tools or tool turns (so it goes through the tool renderer)."""
        return bool(self.tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in self.messages)


# Parameters of the OpenAI API that rlkit does not implement: accepted at these neutral values only.
_NEUTRAL: Dict[str, Any] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "modalities": (["text"],),
    "reasoning_effort": (),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
}
# Parameters with no effect on what is generated: accepted and ignored.
_INERT = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key", "verbosity"}
_KNOWN = {
    "model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop",
    "seed", "logprobs", "top_logprobs", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls",
    "response_format",
}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_error(param: str, expected: str, value: Any) -> APIError:
    got = {bool: "a boolean", str: "a string", list: "an array", dict: "an object", type(None): "null"}.get(type(value))
    got = got or ("a decimal" if isinstance(value, float) else "an integer" if isinstance(value, int) else type(value).__name__)
    return bad_request(f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param, "invalid_type")


def _number(body: Mapping[str, Any], name: str, lo: float, hi: float) -> Optional[float]:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value):
        raise _type_error(name, "a decimal", value)
    if not lo <= value <= hi:
        raise bad_request(f"Invalid '{name}': expected a value between {lo:g} and {hi:g}, but got {value} instead.", name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, lo: int, hi: Optional[int] = None, *, why: str = "") -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise _type_error(name, "an integer", value)
    if value < lo:
        raise bad_request(f"Invalid '{name}': integer below minimum value. Expected a value >= {lo}, but got {value} instead.", name, "integer_below_min_value")
    if hi is not None and value > hi:
        raise bad_request(
            f"Invalid '{name}': integer above maximum value. Expected a value <= {hi}{why}, but got {value} instead.", name, "integer_above_max_value"
        )
    return value


def _boolean(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise bad_request(f"Invalid '{where}[{j}]': only text content parts are supported by this server, got {kind!r}.", f"{where}[{j}]")
            texts.append(part["text"])
        return "\n".join(texts)
    raise _type_error(where, "a string or an array of text parts", value)


def parse_messages(value: Any, limits: Limits) -> List[Dict[str, Any]]:
    if value is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(value, list):
        raise _type_error("messages", "an array", value)
    if not value:
        raise bad_request("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.", "messages", "empty_array")
    if len(value) > limits.max_messages:
        raise bad_request(f"Invalid 'messages': at most {limits.max_messages} messages are accepted, got {len(value)}.", "messages", "array_above_max_length")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise _type_error(where, "an object", m)
        role = m.get("role")
        if role is None:
            raise bad_request(f"Missing required parameter: '{where}.role'.", f"{where}.role", "missing_required_parameter")
        if role not in _ROLES:
            supported = "', '".join(_ROLES)
            raise bad_request(f"Invalid value for '{where}.role': {role!r} is not supported by this server (supported: '{supported}').", f"{where}.role")
        try:
            extra = tool_message_fields(m, role, where)
        except ToolParamError as exc:
            raise bad_request(exc.message, exc.param, exc.code) from None
        content = m.get("content")
        if content is None and role != "assistant":
            raise bad_request(f"Missing required parameter: '{where}.content'.", f"{where}.content", "missing_required_parameter")
        out.append({"role": _ROLES[role], "content": "" if content is None else _content(content, f"{where}.content"), **extra})
    return out


def parse_chat_request(body: Any, limits: Limits) -> ChatRequest:
    """Validate a request body; raise :class:`APIError` (400) naming the first bad parameter."""
    if not isinstance(body, Mapping):
        raise bad_request("The request body must be a JSON object.", None, "invalid_json")
    for name, value in body.items():
        if name in _KNOWN or name in _INERT:
            continue
        if name in _NEUTRAL:
            if value is None or any(value == v for v in _NEUTRAL[name]):
                continue
            raise bad_request(f"Unsupported parameter: '{name}' is not supported by this server.", name, "unsupported_parameter")
        raise bad_request(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    model = body.get("model")
    if model is None:
        raise bad_request("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise _type_error("model", "a string", model)
    messages = parse_messages(body.get("messages"), limits)
    n = _integer(body, "n", 1, limits.max_n, why=" (this server's limit)")
    max_tokens = _integer(body, "max_tokens", 1, limits.max_tokens, why=" (this server's limit)")
    max_completion = _integer(body, "max_completion_tokens", 1, limits.max_tokens, why=" (this server's limit)")
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise bad_request("Give either 'max_tokens' or 'max_completion_tokens', not two different values.", "max_completion_tokens")
    temperature = _number(body, "temperature", 0, 2)
    top_p = _number(body, "top_p", 0, 1)
    top_k = _integer(body, "top_k", -1)
    if top_k == 0:
        raise bad_request("Invalid 'top_k': expected a value >= 1, or -1 to disable.", "top_k")
    seed = _integer(body, "seed", -(2**63), 2**63 - 1)
    stop = body.get("stop")
    if stop is None:
        stops: List[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise _type_error("stop", "a string or an array of strings", stop)
    if len(stops) > limits.max_stop:
        raise bad_request(f"Invalid 'stop': array too long. Expected an array with maximum length {limits.max_stop}, but got {len(stops)} instead.", "stop", "array_above_max_length")
    if any(s == "" for s in stops):
        raise bad_request("Invalid 'stop': stop sequences must be non-empty strings.", "stop")
    logprobs = _boolean(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", 0, limits.max_top_logprobs)
    if top_logprobs and not logprobs:
        raise bad_request("Invalid 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is given.", "top_logprobs")
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("Invalid 'stream_options': only allowed when 'stream' is true.", "stream_options")
        if not isinstance(options, Mapping):
            raise _type_error("stream_options", "an object", options)
        unknown = sorted(set(options) - {"include_usage", "include_obfuscation"})
        if unknown:
            raise bad_request(f"Unrecognized request argument supplied: stream_options.{unknown[0]}", "stream_options")
        include_usage = _boolean(options, "include_usage")
    try:
        tools = parse_tools(body.get("tools"))
        tool_choice = parse_tool_choice(body.get("tool_choice"), tools)
    except ToolParamError as exc:
        raise bad_request(exc.message, exc.param, exc.code) from None
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _type_error("parallel_tool_calls", "a boolean", parallel)
    try:
        check_forced_tools(tools, tool_choice)
    except ToolParamError as exc:
        raise bad_request(exc.message, exc.param, exc.code) from None
    return ChatRequest(
        model=model,
        messages=messages,
        n=n or 1,
        max_tokens=max_tokens if max_tokens is not None else max_completion,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=stops,
        seed=seed,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        stream=stream,
        include_usage=include_usage,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=True if parallel is None else parallel,
        response_format=parse_response_format(body.get("response_format")),
    )


def parse_response_format(value: Any) -> Optional[Dict[str, Any]]:
    """``response_format`` -> the JSON schema the content must fit (``None`` for text); a schema
    that cannot be compiled is a 400 naming where in it (``#/properties/...``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _type_error("response_format", "an object", value)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise bad_request(
            f"Invalid value for 'response_format.type': {kind!r}; supported: 'text', 'json_object', 'json_schema'.",
            "response_format.type",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise bad_request(
            "Missing required parameter: 'response_format.json_schema'.", "response_format.json_schema", "missing_required_parameter"
        )
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(
            "Missing required parameter: 'response_format.json_schema.name'.",
            "response_format.json_schema.name",
            "missing_required_parameter",
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, Mapping):
        raise _type_error("response_format.json_schema.schema", "an object", schema)
    problem = schema_error(schema)
    if problem is not None:
        raise bad_request(
            f"Invalid schema for response_format '{name}': at {problem[0]}: {problem[1]}",
            "response_format.json_schema.schema",
            "invalid_json_schema",
        )
    return dict(schema)


# -- responses --------------------------------------------------------------------------------------


def new_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def usage_body(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def completion_body(
    *, id: str, model: str, created: int, fingerprint: str, choices: List[Dict[str, Any]], prompt_tokens: int, completion_tokens: int
) -> Dict[str, Any]:
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
        "usage": usage_body(prompt_tokens, completion_tokens),
    }


def choice_delta(index: int, delta: Dict[str, Any], *, logprobs: Optional[Dict[str, Any]] = None, finish_reason: Optional[str] = None) -> Dict[str, Any]:
    """One choice of a ``chat.completion.chunk``."""
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def chunk_body(*, id: str, model: str, created: int, fingerprint: str, choices: List[Dict[str, Any]], usage: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def model_card(name: str, created: Optional[int] = None, **extra: Any) -> Dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created or time.time()), "owned_by": "rlkit", **extra}
