"""Tools over the OpenAI chat-completions API: ``tools``, ``tool_choice``, ``tool_calls``, ``tool`` messages.

Request side (:func:`parse_tools`, :func:`parse_tool_choice`, :func:`tool_message_fields`): tools
are OpenAI function tools (``{"type": "function", "function": {"name", "description",
"parameters"}}``), validated like OpenAI validates them; ``tool_choice`` is ``"none"``, ``"auto"``
(the default when tools are given), ``"required"`` or ``{"type": "function", "function": {"name"}}``;
assistant messages may carry ``tool_calls`` (``content`` may then be null) and ``tool`` messages
need ``tool_call_id``.

Rendering: :class:`~rlkit.tools.ToolRenderer` — the model's own tool template, or the ChatML
fallback format rlkit trains with. ``required`` and a named function are honoured by **prefilling**
the assistant turn with ``<tool_call>{"name": "`` (resp. ``<tool_call>{"name": "<name>",
"arguments":``) and **constrained decoding** of the rest (:func:`tool_constraint`): a grammar that
admits exactly one call in the renderer's format — a known name (``required``), arguments that are
JSON fitting that tool's ``parameters`` (no keys beyond its ``properties`` unless it allows
``additionalProperties``), then ``}</tool_call>`` — so the call always parses, unless
``max_tokens`` runs out first (``finish_reason: "length"``). A schema the grammar compiler cannot
compile is a 400 naming where in it (:func:`check_forced_tools`). ``none`` renders the tools but
never parses a call.

Response side (:func:`tool_choice_result`): the completion (with its prefill) is parsed strictly;
well-formed calls become ``message.tool_calls`` (``id`` ``call_<hex>``, ``arguments`` a JSON string)
with ``finish_reason: "tool_calls"``, the text outside them ``content`` (null when empty). A
malformed call is not a call: the text comes back as ``content`` with the usual finish reason.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from rlkit.tools.base import Tool


class ToolParamError(ValueError):
    """A bad tool parameter: :mod:`rlkit.serve.protocol` answers it as OpenAI's 400 (``param``, ``code``)."""

    def __init__(self, message: str, param: Optional[str], code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def bad_request(message: str, param: Optional[str], code: str = "invalid_value") -> ToolParamError:
    return ToolParamError(message, param, code)


class SchemaTool(Tool):
    """A tool known only by its schema (the caller runs it); used to check call arguments."""

    def __init__(self, schema: Mapping[str, Any]):
        fn = schema["function"]
        self.name, self.description = fn["name"], fn.get("description", "")
        self.parameters = fn.get("parameters") or {"type": "object", "properties": {}}

    def call(self, arguments: Mapping[str, Any]) -> str:  # pragma: no cover - the client runs its tools
        raise NotImplementedError("tools of an API request run on the client")


def parse_tools(value: Any) -> List[Dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("Invalid type for 'tools': expected an array of tool objects.", "tools", "invalid_type")
    out, names = [], set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise bad_request(
                f"Invalid value for '{where}.type': only 'function' tools are supported.", f"{where}.type"
            )
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(
                f"Missing required parameter: '{where}.function.name'.",
                f"{where}.function.name",
                "missing_required_parameter",
            )
        name = fn["name"]
        if len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
            raise bad_request(
                f"Invalid '{where}.function.name': '{name}' must match ^[a-zA-Z0-9_-]{{1,64}}$.",
                f"{where}.function.name",
            )
        if name in names:
            raise bad_request(f"Invalid 'tools': the function name '{name}' appears twice.", "tools")
        names.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping) or params.get("type", "object") != "object":
            raise bad_request(
                f"Invalid '{where}.function.parameters': expected a JSON schema object of type 'object'.",
                f"{where}.function.parameters",
            )
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise bad_request(
                f"Invalid type for '{where}.function.description': expected a string.",
                f"{where}.function.description",
                "invalid_type",
            )
        out.append(
            {"type": "function", "function": {"name": name, "description": description, "parameters": dict(params)}}
        )
    return out


def parse_tool_choice(value: Any, tools: List[Dict[str, Any]]) -> Any:
    """``"none"`` | ``"auto"`` | ``"required"`` | a function name (str) for ``{"type": "function", ...}``."""
    if value is None:
        return "auto" if tools else "none"
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise bad_request("Invalid value for 'tool_choice': 'required' needs 'tools'.", "tool_choice")
        return value
    if isinstance(value, Mapping) and value.get("type") == "function" and isinstance(value.get("function"), Mapping):
        name = value["function"].get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise bad_request(f"Invalid value for 'tool_choice': no tool named {name!r} in 'tools'.", "tool_choice")
        return str(name)
    raise bad_request(
        "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or a function choice.", "tool_choice"
    )


def tool_message_fields(m: Mapping[str, Any], role: str, where: str) -> Dict[str, Any]:
    """The tool-related fields of one request message, checked (``tool_calls``; ``tool_call_id``)."""
    out: Dict[str, Any] = {}
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(
                f"Missing required parameter: '{where}.tool_call_id'.",
                f"{where}.tool_call_id",
                "missing_required_parameter",
            )
        out["tool_call_id"] = call_id
    calls = m.get("tool_calls")
    if calls:
        if role != "assistant":
            raise bad_request(
                f"Invalid '{where}': only assistant messages can have 'tool_calls'.", f"{where}.tool_calls"
            )
        if not isinstance(calls, list):
            raise bad_request(
                f"Invalid type for '{where}.tool_calls': expected an array.", f"{where}.tool_calls", "invalid_type"
            )
        out["tool_calls"] = []
        for j, c in enumerate(calls):
            at = f"{where}.tool_calls[{j}]"
            fn = c.get("function") if isinstance(c, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise bad_request(
                    f"Missing required parameter: '{at}.function.name'.",
                    f"{at}.function.name",
                    "missing_required_parameter",
                )
            args = fn.get("arguments", "{}")
            try:
                parsed = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                raise bad_request(
                    f"Invalid '{at}.function.arguments': not valid JSON.", f"{at}.function.arguments"
                ) from None
            if not isinstance(parsed, dict):
                raise bad_request(
                    f"Invalid '{at}.function.arguments': expected a JSON object.", f"{at}.function.arguments"
                )
            out["tool_calls"].append(
                {
                    "id": str(c.get("id") or f"call_{j}"),
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": parsed},
                }
            )
    if m.get("function_call"):
        raise bad_request(
            f"Invalid '{where}': the legacy 'function_call' is not supported; use 'tool_calls'.",
            f"{where}.function_call",
        )
    return out


def schema_error(schema: Any) -> Optional[tuple]:
    """``None`` when ``schema`` compiles for constrained decoding, else ``(where, why)`` (``where``:
    a JSON pointer into it)."""
    from rlkit.constraints import schema_problem
    from rlkit.errors import InvalidInputError

    try:
        return schema_problem(schema)
    except InvalidInputError as exc:  # llguidance missing
        return "#", str(exc)


def arguments_schema(tool: Mapping[str, Any]) -> Dict[str, Any]:
    """A tool's ``parameters`` as the grammar uses them: unknown keys are refused (as
    :func:`rlkit.tools.base.check_arguments` refuses them) unless the schema allows them."""
    params = dict(tool["function"].get("parameters") or {"type": "object", "properties": {}})
    params.setdefault("additionalProperties", False)
    return params


def check_forced_tools(tools: List[Dict[str, Any]], tool_choice: Any) -> None:
    """The schemas a forced call is decoded with compile, or a 400 naming the tool and where in its schema."""
    if tool_choice in (None, "none", "auto"):
        return
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        if tool_choice != "required" and name != tool_choice:
            continue
        problem = schema_error(arguments_schema(tool))
        if problem is not None:
            raise bad_request(
                f"Invalid schema for function '{name}': at {problem[0]}: {problem[1]}",
                f"tools[{i}].function.parameters",
                "invalid_function_parameters",
            )


def tool_constraint(tools: List[Dict[str, Any]], tool_choice: Any, native: bool = False) -> Optional[Any]:
    """The :class:`~rlkit.types.Constraint` on the completion after :func:`prefill_for`'s prefill:
    one call (of the named tool, or of any tool for ``required``) in the renderer's format, its
    arguments fitting the tool's schema; ``None`` when no call is forced."""
    from rlkit.constraints import lark_json, lark_text
    from rlkit.types import Constraint

    if tool_choice in (None, "none", "auto") or not tools:
        return None
    tail = lark_text("}" + ("\n" if native else "") + "</tool_call>")
    if tool_choice != "required":
        tool = next(t for t in tools if t["function"]["name"] == tool_choice)
        return Constraint(lark=f"start: \" \" {lark_json(arguments_schema(tool))} {tail}\n")
    rules = []
    for k, t in enumerate(tools):
        head = lark_text(t["function"]["name"] + '", "arguments": ')
        rules.append(f"call_{k}: {head} {lark_json(arguments_schema(t))} {tail}")
    return Constraint(lark="start: " + " | ".join(f"call_{k}" for k in range(len(tools))) + "\n" + "\n".join(rules) + "\n")


def forced_choice(tool_choice: Any, tools: List[Dict[str, Any]]) -> Any:
    """``tool_choice`` as it is decoded: ``required`` with a single tool is that tool, named (its
    name is then prefilled instead of generated)."""
    if tool_choice == "required" and len(tools) == 1:
        return tools[0]["function"]["name"]
    return tool_choice


def prefill_for(tool_choice: Any, native: bool = False) -> str:
    """The assistant-turn prefill that starts the forced call (``required`` / a named function),
    in the renderer's call format (the Hermes template's ``<tool_call>\n{...}``, or the fallback's
    ``<tool_call>{...}``). It ends where the tokenizer's pre-tokenizer splits anyway (before a name,
    after ``":``), so the tokens that follow are the ones the model learnt."""
    head = "<tool_call>\n" if native else "<tool_call>"
    if tool_choice == "required":
        return head + '{"name": "'
    if tool_choice not in (None, "none", "auto"):
        return head + '{"name": ' + json.dumps(tool_choice) + ', "arguments":'
    return ""


@dataclass
class ToolResult:
    content: Optional[str]
    tool_calls: Optional[List[Dict[str, Any]]]
    finish_reason: str


def tool_choice_result(
    text: str, prefill: str, tools: List[Dict[str, Any]], tool_choice: Any, finish_reason: str, parallel: bool = True
) -> ToolResult:
    """Parse one completion (after ``prefill``) into the choice's content, calls and finish reason."""
    from rlkit.tools.render import parse_tool_calls

    if tool_choice == "none" or not tools:
        return ToolResult(text, None, finish_reason)
    full = prefill + text
    parsed = parse_tool_calls(full, {t["function"]["name"]: SchemaTool(t) for t in tools})
    if not parsed.calls or parsed.errors:
        return ToolResult(full if prefill else text, None, finish_reason)
    calls = parsed.calls if parallel else parsed.calls[:1]
    out = [
        {
            "id": "call_" + uuid.uuid4().hex[:24],
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]
    return ToolResult(parsed.content or None, out, "tool_calls")
