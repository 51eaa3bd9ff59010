"""Tools a model can call: a name, a JSON schema, and a ``call(arguments) -> str`` that never hurts the host.

A :class:`Tool` declares its schema in the OpenAI / Hugging Face function format
(``{"type": "function", "function": {"name", "description", "parameters"}}``) and returns text.
:func:`run_tool` is the only way rlkit invokes a tool: it enforces the tool's per-call timeout
(``timeout_s``) and output limit (``max_output_chars``), and turns every failure — bad arguments,
an exception, a timeout — into a :class:`ToolOutcome` whose text goes back to the model as the
tool message (``"Error: ..."``); nothing a tool does is raised into the RL loop.

:func:`tool_schema` builds the schema of a Python callable from its signature and Google-style
docstring with transformers' own ``get_json_schema`` (what ``apply_chat_template(tools=[fn])``
uses), so a schema rlkit shows the model is the one the chat template would render.
:class:`FunctionTool` wraps any user callable. A callable runs in this process (it is the user's
own trusted code): the timeout stops *waiting* for it — its result is discarded and the model is
told — but cannot stop a thread; code that must be contained (model-written programs) belongs in
:class:`~rlkit.tools.builtin.PythonTool`, which runs it in :mod:`rlkit.sandbox`.
"""

from __future__ import annotations

import concurrent.futures
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from rlkit.errors import ConfigError

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="rlkit-tool")
JSON_TYPES: Dict[str, tuple] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class ToolError(Exception):
    """A tool refused its arguments or failed; the message is shown to the model."""


@dataclass
class ToolOutcome:
    """What one call returned: ``content`` (the tool message's text) and ``error`` (``""`` when it
    succeeded, else ``bad_arguments`` | ``tool_error`` | ``timeout``)."""

    content: str
    error: str = ""
    truncated: bool = False


class Tool:
    """Base class: set ``name``, ``description``, ``parameters`` (a JSON schema object) and implement
    :meth:`call`. Defaults: a 10 s timeout and 2,000 characters of output per call."""

    name: str = ""
    description: str = ""
    parameters: Dict[str, Any] = {"type": "object", "properties": {}}
    timeout_s: float = 10.0
    max_output_chars: int = 2000

    @property
    def schema(self) -> Dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def call(self, arguments: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the tool holds (a sandbox pool); called when the task closes."""


def tool_schema(fn: Callable[..., Any]) -> Dict[str, Any]:
    """The function-calling schema of ``fn`` (type hints + Google-style docstring with ``Args:``)."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers raises several types for undocumented functions
        raise ConfigError(f"tool {getattr(fn, '__name__', fn)!r}: cannot build a schema ({exc})") from None
    schema["function"].pop("return", None)
    return schema


class FunctionTool(Tool):
    """Any Python callable as a tool; its schema from :func:`tool_schema` (or given)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        schema: Optional[Dict[str, Any]] = None,
        timeout_s: float = 10.0,
        max_output_chars: int = 2000,
    ):
        if not callable(fn):
            raise ConfigError(f"tool {fn!r} is not callable")
        self.fn = fn
        spec = (schema or tool_schema(fn))["function"]
        self.name, self.description = spec["name"], spec.get("description", "")
        self.parameters = spec.get("parameters") or {"type": "object", "properties": {}}
        self.timeout_s, self.max_output_chars = float(timeout_s), int(max_output_chars)

    def call(self, arguments: Mapping[str, Any]) -> str:
        out = self.fn(**arguments)
        return out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, default=str)


def check_arguments(tool: Tool, arguments: Any) -> List[str]:
    """What is wrong with ``arguments`` for ``tool``'s schema (required keys, unknown keys, JSON types)."""
    if not isinstance(arguments, dict):
        return [f"arguments must be a JSON object, got {type(arguments).__name__}"]
    props: Mapping[str, Any] = tool.parameters.get("properties") or {}
    problems = [f"missing required argument {k!r}" for k in tool.parameters.get("required") or [] if k not in arguments]
    if tool.parameters.get("additionalProperties", False) is not True:
        problems += [
            f"unknown argument {k!r} (expected {sorted(props) or 'none'})" for k in arguments if k not in props
        ]
    for k, v in arguments.items():
        kinds = (props.get(k) or {}).get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if kinds and not any(
            isinstance(v, JSON_TYPES.get(t, object)) and not (t in ("integer", "number") and isinstance(v, bool))
            for t in kinds
        ):
            problems.append(f"argument {k!r} must be {' or '.join(kinds)}, got {type(v).__name__}")
    return problems


def _clip(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n... [output truncated: {len(text) - limit} more characters]", True


def run_tool(tool: Tool, arguments: Any) -> ToolOutcome:
    """Call ``tool`` with its timeout and output limit; every failure becomes an ``Error: ...`` outcome."""
    problems = check_arguments(tool, arguments)
    if problems:
        return ToolOutcome(f"Error: bad arguments for {tool.name}: " + "; ".join(problems), "bad_arguments")
    future = _POOL.submit(tool.call, arguments)
    try:
        out = future.result(timeout=tool.timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        return ToolOutcome(f"Error: {tool.name} timed out after {tool.timeout_s:g} s", "timeout")
    except ToolError as exc:
        return ToolOutcome(_clip(f"Error: {exc}", tool.max_output_chars)[0], "tool_error")
    except Exception as exc:  # noqa: BLE001 - a user tool may raise anything; the model is told
        return ToolOutcome(
            _clip(f"Error: {tool.name} raised {type(exc).__name__}: {exc}", tool.max_output_chars)[0], "tool_error"
        )
    text, truncated = _clip(str(out), tool.max_output_chars)
    return ToolOutcome(text, "", truncated)
