"""Conversations with tools -> tokens, and completions -> tool calls.

**Two ways to render.** :class:`ToolRenderer` uses the tokenizer's own chat template when that
template renders tools (``apply_chat_template(..., tools=...)``), assistant ``tool_calls`` and
``tool`` messages in the Hermes/Qwen form ``<tool_call>{...}</tool_call>`` — checked by rendering
probes, not by name. Otherwise (the embedded SmolLM2-135M-Instruct template has no tool support)
it rewrites the conversation into plain ChatML turns, the **fallback format**:

* the tool schemas go into the system turn (appended to the conversation's own system message,
  or a new first message), as one JSON object per line inside ``<tools>...</tools>``, with
  :data:`FALLBACK_INSTRUCTIONS`;
* an assistant turn's calls follow its content, one per line:
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 2"}}</tool_call>``;
* each result is a ``tool`` role turn whose content is the tool's text.

Messages are given in the OpenAI shape either way (``{"role": "assistant", "content": ...,
"tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}``,
``{"role": "tool", "tool_call_id", "content"}``), so the same conversation renders on both paths.
All rendering goes through :func:`rlkit.chat.render_ids`, so text in messages, tool results and
schemas never becomes control tokens.

**Parsing is strict** (:func:`parse_tool_calls`): every ``<tool_call>`` block must close, hold one
JSON object with exactly the keys ``name`` (a known tool) and ``arguments`` (an object that fits
the tool's schema); each violation is reported in words (``tool call 1: invalid JSON (Expecting
',' delimiter at character 31)``) and counts as a malformed call.

**Turn by turn, tokens only grow.** :meth:`ToolRenderer.continuation` gives the tokens that follow
a sampled assistant turn — the template's end of that turn (minus the end-of-turn token when the
model sampled it), the new tool / user turns, and the next assistant header — computed from
renders of the conversation with a placeholder for the sampled turn, so the sampled tokens are
kept exactly and only the template's own text is added. :func:`check_prefix_stability` proves
(or refutes) that this equals a fresh render of the whole conversation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from rlkit.chat import Rendered, plain_tokens, render_ids, render_weighted
from rlkit.errors import ConfigError, DataError
from rlkit.tools.base import Tool, check_arguments

FALLBACK_INSTRUCTIONS = (
    "# Tools\n\nYou can call these tools; each line is one tool's JSON schema:\n<tools>\n{schemas}\n</tools>\n\n"
    "To call a tool, answer with one line per call and nothing else:\n"
    '<tool_call>{{"name": "<tool name>", "arguments": {{<the arguments as a JSON object>}}}}</tool_call>\n'
    "Each result comes back in a tool turn. When you know the answer, reply with it and no tool call."
)
PLACEHOLDER = "rlkitplaceholderturn"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class ToolCall:
    name: str
    arguments: Dict[str, Any]
    id: str = ""

    def openai(self) -> Dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (arguments as a JSON string, as OpenAI sends them)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass
class ParsedTurn:
    """An assistant completion split into its text and its tool calls."""

    content: str
    calls: List[ToolCall] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)  # one per malformed call

    @property
    def attempted(self) -> int:
        return len(self.calls) + len(self.errors)


def parse_tool_calls(text: str, tools: Optional[Mapping[str, Tool]] = None) -> ParsedTurn:
    """The tool calls in ``text`` (see the module docstring); ``tools`` (by name) checks names and arguments."""
    calls: List[ToolCall] = []
    errors: List[str] = []
    content_parts: List[str] = []
    pos = 0
    for k, match in enumerate(_CALL.finditer(text), start=1):
        content_parts.append(text[pos : match.start()])
        pos = match.end()
        where = f"tool call {k}"
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"{where}: invalid JSON ({exc.msg} at character {exc.pos}): {body[:80]!r}")
            continue
        if not isinstance(obj, dict):
            errors.append(f"{where}: expected a JSON object with 'name' and 'arguments', got {type(obj).__name__}")
            continue
        extra = sorted(set(obj) - {"name", "arguments"})
        if extra or "name" not in obj or "arguments" not in obj:
            missing = [key for key in ("name", "arguments") if key not in obj]
            errors.append(
                f"{where}: "
                + "; ".join([f"missing key {m!r}" for m in missing] + [f"unknown key {e!r}" for e in extra])
            )
            continue
        name, arguments = obj["name"], obj["arguments"]
        if not isinstance(name, str):
            errors.append(f"{where}: 'name' must be a string")
            continue
        if tools is not None and name not in tools:
            errors.append(f"{where}: unknown tool {name!r} (known: {', '.join(sorted(tools)) or 'none'})")
            continue
        problems = (
            check_arguments(tools[name], arguments)
            if tools is not None
            else ([] if isinstance(arguments, dict) else ["arguments must be a JSON object"])
        )
        if problems:
            errors.append(f"{where} ({name}): " + "; ".join(problems))
            continue
        calls.append(ToolCall(name=name, arguments=dict(arguments), id=f"call_{len(calls)}"))
    rest = text[pos:]
    if "<tool_call>" in rest:
        errors.append(f"tool call {len(calls) + len(errors) + 1}: '<tool_call>' is never closed with '</tool_call>'")
        rest = rest[: rest.index("<tool_call>")]
    content_parts.append(rest)
    return ParsedTurn(content="".join(content_parts).strip(), calls=calls, errors=errors)


def _arguments(raw: Any, where: str) -> Dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: arguments are not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict):
        raise DataError(f"{where}: arguments must be a JSON object")
    return raw


def normalize_messages(messages: Any, where: str = "conversation") -> List[Dict[str, Any]]:
    """Check OpenAI-shaped messages and return copies: roles in :data:`ROLES`, string content
    (``None`` allowed for an assistant turn with calls), calls with ``name`` and object arguments."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError(f"{where}: expected a non-empty list of messages")
    out: List[Dict[str, Any]] = []
    for i, m in enumerate(messages):
        at = f"{where}: message {i}"
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise DataError(f"{at}: expected a mapping with role in {list(ROLES)}")
        content = m.get("content")
        calls = m.get("tool_calls") or []
        if content is None and not (m["role"] == "assistant" and calls):
            raise DataError(f"{at}: missing 'content'")
        if content is not None and not isinstance(content, str):
            raise DataError(f"{at}: 'content' must be a string")
        msg: Dict[str, Any] = {"role": m["role"], "content": content or ""}
        if calls:
            if m["role"] != "assistant":
                raise DataError(f"{at}: only assistant messages carry tool_calls")
            msg["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function", c) if isinstance(c, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise DataError(f"{at}: tool_calls[{j}] needs function.name")
                msg["tool_calls"].append(
                    {
                        "id": str(c.get("id") or f"call_{j}"),
                        "type": "function",
                        "function": {
                            "name": fn["name"],
                            "arguments": _arguments(fn.get("arguments", {}), f"{at}: tool_calls[{j}]"),
                        },
                    }
                )
        if m["role"] == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or "")
            if m.get("name"):
                msg["name"] = str(m["name"])
        out.append(msg)
    return out


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call in the fallback format."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False) + "</tool_call>"


ToolLike = Union[Tool, Mapping[str, Any]]


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's template renders tool schemas, ``<tool_call>`` calls and tool results
    (by rendering probes with unique names and looking for them)."""
    schema = {
        "type": "function",
        "function": {
            "name": "rlkit_probe_tool",
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "rlkit_probe_call", "arguments": {}}}],
    }
    convo = [
        {"role": "user", "content": "hi"},
        call,
        {"role": "tool", "tool_call_id": "call_0", "content": "rlkit_probe_result"},
    ]
    try:
        text = tokenizer.apply_chat_template(convo, tools=[schema], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses tools or tool roles
        return False
    return all(s in text for s in ("rlkit_probe_tool", "rlkit_probe_call", "rlkit_probe_result")) and bool(
        re.search(r"<tool_call>\s*\{\"name\": \"rlkit_probe_call\"", text)
    )


class ToolRenderer:
    """Renders conversations with ``tools`` for one tokenizer (see the module docstring).

    ``mode``: ``auto`` (the template's own tool format when it has one, else the fallback),
    ``native`` (refuse a template without one) or ``fallback``."""

    def __init__(self, tokenizer: Any, tools: Sequence[ToolLike] = (), *, mode: str = "auto"):
        if mode not in ("auto", "native", "fallback"):
            raise ConfigError(f"tool rendering mode={mode!r}: choose auto, native or fallback")
        self.tokenizer = tokenizer
        self.tools: Dict[str, Tool] = {}
        self.schemas: List[Dict[str, Any]] = []
        for t in tools:
            schema = t.schema if isinstance(t, Tool) else dict(t)
            self.schemas.append(schema)
            if isinstance(t, Tool):
                self.tools[t.name] = t
        supported = template_supports_tools(tokenizer)
        if mode == "native" and not supported:
            raise ConfigError(
                "this tokenizer's chat template does not render tools in the <tool_call> format; use mode=fallback"
            )
        self.native = supported and mode != "fallback"
        self.end_of_turn = self._end_of_turn()

    # -- conversations -> template messages ---------------------------------------------------------
    def template_messages(self, messages: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        """What goes to ``apply_chat_template``: the OpenAI-shaped messages as they are (native) or
        rewritten into the fallback format."""
        if self.native:
            return [dict(m) for m in messages]
        out: List[Dict[str, Any]] = []
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                lines = [
                    format_call(c["function"]["name"], _arguments(c["function"]["arguments"], "tool call"))
                    for c in m["tool_calls"]
                ]
                content = "\n".join(([m["content"]] if m.get("content") else []) + lines)
                out.append({"role": "assistant", "content": content})
            else:
                out.append({"role": m["role"], "content": m.get("content") or ""})
        if self.schemas:
            block = FALLBACK_INSTRUCTIONS.format(
                schemas="\n".join(json.dumps(s, ensure_ascii=False) for s in self.schemas)
            )
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    def _ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
    ) -> List[int]:
        return render_ids(
            self.tokenizer,
            self.template_messages(messages),
            add_generation_prompt=add_generation_prompt,
            tools=self.schemas if self.native else None,
            continue_final_message=continue_final_message,
        )

    def prompt(self, messages: Sequence[Mapping[str, Any]], prefill: str = "") -> List[int]:
        """Tokens of ``messages`` + the assistant header (+ ``prefill`` as plain text)."""
        return self._ids(normalize_messages(messages), add_generation_prompt=True) + plain_tokens(
            self.tokenizer, prefill
        )

    def render(
        self, messages: Sequence[Mapping[str, Any]], train_on: str = "assistant", where: str = "conversation"
    ) -> Rendered:
        """Tokens of the whole conversation, weight 1 on the trained turns (an SFT datum's input)."""
        msgs = self.template_messages(normalize_messages(messages, where))
        return render_weighted(
            self.tokenizer, msgs, train_on=train_on, tools=self.schemas if self.native else None, where=where
        )  # type: ignore[arg-type]

    # -- turn by turn -------------------------------------------------------------------------------
    def continuation(
        self,
        history: Sequence[Mapping[str, Any]],
        new_messages: Sequence[Mapping[str, Any]],
        action: Sequence[int],
        prefill: str = "",
    ) -> List[int]:
        """The tokens that follow the sampled assistant turn ``action`` (which comes after
        ``history``): the rest of that turn, ``new_messages`` and the next assistant header."""
        hist = normalize_messages(history) + [{"role": "assistant", "content": PLACEHOLDER}]
        new = normalize_messages(new_messages) if new_messages else []
        opened = self._ids(hist, add_generation_prompt=False, continue_final_message=True)
        closed = self._ids(hist, add_generation_prompt=False)
        full = self._ids(hist + new, add_generation_prompt=True)
        if closed[: len(opened)] != opened or full[: len(closed)] != closed:
            raise DataError(
                "the chat template does not render the conversation turn by turn as a prefix; "
                "see rlkit.tools.check_prefix_stability"
            )
        turn_end = closed[len(opened) :]
        if action and turn_end and action[-1] == turn_end[0]:
            turn_end = turn_end[1:]  # the model sampled the end-of-turn token itself
        return turn_end + full[len(closed) :] + plain_tokens(self.tokenizer, prefill)

    def _end_of_turn(self) -> Optional[int]:
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PLACEHOLDER}]
        opened = self._ids(probe, add_generation_prompt=False, continue_final_message=True)
        closed = self._ids(probe, add_generation_prompt=False)
        return closed[len(opened)] if len(closed) > len(opened) else None

    def turn_tokens(self, history: Sequence[Mapping[str, Any]], message: Mapping[str, Any]) -> List[int]:
        """The tokens a model emits for assistant ``message`` after ``history`` in this format: the
        template's rendering of the turn through its end-of-turn token (for prefix checks and demos)."""
        start = self._ids(normalize_messages(history), add_generation_prompt=True)
        whole = self._ids(normalize_messages(list(history) + [dict(message)]), add_generation_prompt=False)
        if whole[: len(start)] != start:
            raise DataError("the chat template does not render the assistant turn after its header")
        turn = whole[len(start) :]
        if self.end_of_turn is not None and self.end_of_turn in turn:
            turn = turn[: turn.index(self.end_of_turn) + 1]
        return turn

    # -- completions -> calls -----------------------------------------------------------------------
    def parse(self, text: str) -> ParsedTurn:
        return parse_tool_calls(text, self.tools or None)

    @staticmethod
    def assistant_message(content: str, calls: Sequence[ToolCall] = ()) -> Dict[str, Any]:
        msg: Dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = [c.openai() for c in calls]
        return msg

    @staticmethod
    def tool_message(call_id: str, name: str, content: str) -> Dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
