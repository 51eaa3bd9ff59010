"""Conversations -> token ids + per-token loss weights, through the tokenizer's own chat template.

``render_conversation(tokenizer, messages)`` returns the exact ids of
``tokenizer.apply_chat_template(messages)`` and a weight per token: 1 on the tokens of the turns
being trained (assistant turns by default, including their end-of-turn token), 0 elsewhere.
Spans are found by rendering growing prefixes of the conversation with the same template and
checking that each is a prefix of the whole, so no turn is ever decoded and re-encoded.

**Message text never becomes control tokens.** Content that contains the text of a special token
(``"<|im_end|>\n<|im_start|>system\n..."``) is encoded as plain text, so a user cannot forge a
system turn: every render goes through ``apply_chat_template(..., sanitize_control_tokens=True)``
(transformers' own mechanism: control-token text inside messages and tools is marked before the
template runs and encoded without added tokens; only the tokens the template itself writes are
control tokens), and text rlkit appends outside the template (an assistant prefill, a reference
answer, a tool result) goes through :func:`plain_tokens`. A role is spliced into the template's
own text (``'<|im_start|>' + role``), which sanitising cannot see, so a role containing
control-token text is refused.

``datum_from_tokens(tokens, weights)`` shifts them into a cross-entropy :class:`Datum`
(``target_tokens[i] = tokens[i+1]``, ``weights[i]`` = weight of token *i+1*).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence

from rlkit.errors import DataError
from rlkit.types import Datum, ModelInput

TrainOn = Literal["assistant", "last_assistant", "all"]
Message = Mapping[str, str]


@dataclass
class Rendered:
    tokens: List[int]
    weights: List[float]

    @property
    def num_trained(self) -> int:
        return int(sum(1 for w in self.weights if w))


def control_tokens(tokenizer: Any) -> List[str]:
    """The text of every special / added control token of ``tokenizer`` (longest first)."""
    found = set(str(t) for t in getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return sorted((t for t in found if t), key=len, reverse=True)


_TEXT_ONLY_BACKENDS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_TEXT_ONLY_LOCK = threading.Lock()


def _text_only_backend(tokenizer: Any) -> Any:
    """A private copy of a fast tokenizer's Rust backend with ``encode_special_tokens`` on, or None
    for a slow tokenizer. ``tokenizer.encode(..., split_special_tokens=True)`` flips that flag on the
    *shared* backend for the duration of the call, so two rollout threads — one encoding a user's
    text, one a template — each saw the other's setting (measured: ~1.5% of 6,000 concurrent encodes
    wrong, user text turned into control tokens). The copy is never mutated after it is built."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    with _TEXT_ONLY_LOCK:
        cached = _TEXT_ONLY_BACKENDS.get(tokenizer)
        if cached is None:
            from tokenizers import Tokenizer

            cached = Tokenizer.from_str(backend.to_str())
            cached.no_truncation()
            cached.no_padding()
            cached.encode_special_tokens = True
            _TEXT_ONLY_BACKENDS[tokenizer] = cached
        return cached


def plain_tokens(tokenizer: Any, text: str) -> List[int]:
    """``text`` encoded as ordinary text: special-token text in it stays text (never a control token).
    Equal to ``tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)`` and safe
    to call from many threads at once (see :func:`_text_only_backend`)."""
    if not text:
        return []
    backend = _text_only_backend(tokenizer)
    if backend is None:
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    return list(backend.encode(text, add_special_tokens=False).ids)


def _check_roles(tokenizer: Any, messages: Sequence[Mapping[str, Any]], where: str) -> None:
    specials = control_tokens(tokenizer)
    for i, m in enumerate(messages):
        role = str(m.get("role", ""))
        hit = next((t for t in specials if t in role), None)
        if hit is not None:
            raise DataError(f"{where}: message {i}: role {role[:40]!r} contains the control token {hit!r}")


def render_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Optional[Sequence[Any]] = None,
    continue_final_message: bool = False,
    where: str = "conversation",
) -> List[int]:
    """Ids of ``messages`` through the tokenizer's own template, control-token text in the
    messages (and ``tools``) encoded as plain text (see the module docstring).
    ``continue_final_message``: stop right after the last message's content (no end of turn)."""
    _check_roles(tokenizer, messages, where)
    kwargs: Dict[str, Any] = {"tools": list(tools)} if tools else {}
    if continue_final_message:
        kwargs["continue_final_message"] = True
    out = tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=True, add_generation_prompt=add_generation_prompt,
        sanitize_control_tokens=True, return_dict=False, **kwargs,
    )
    if isinstance(out, Mapping) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def prompt_tokens(tokenizer: Any, messages: Sequence[Message], prefill: str = "") -> List[int]:
    """Ids of ``messages`` followed by the assistant header (and an optional assistant prefill,
    encoded as plain text)."""
    return render_ids(tokenizer, messages, add_generation_prompt=True) + plain_tokens(tokenizer, prefill)


def check_messages(messages: Any, where: str = "conversation") -> List[Dict[str, str]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError(f"{where}: expected a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: message {i} must be a mapping with string 'role' and 'content'")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render_conversation(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    train_on: TrainOn = "assistant",
    max_length: Optional[int] = None,
    truncation: Literal["right", "error"] = "right",
    where: str = "conversation",
) -> Rendered:
    """Token ids of the whole conversation and a loss weight per token (see module docstring)."""
    rendered = render_weighted(tokenizer, check_messages(messages, where), train_on=train_on, where=where)
    full, weights = rendered.tokens, rendered.weights
    if max_length is not None and len(full) > max_length:
        if truncation == "error":
            raise DataError(f"{where}: {len(full)} tokens exceed max_length={max_length}")
        full, weights = full[:max_length], weights[:max_length]
    return Rendered(tokens=full, weights=weights)


def render_weighted(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    train_on: TrainOn = "assistant",
    tools: Optional[Sequence[Any]] = None,
    where: str = "conversation",
) -> Rendered:
    """:func:`render_conversation` for messages that are already checked (they may carry
    ``tool_calls`` / ``tool_call_id``), optionally with ``tools``; no truncation."""
    full = render_ids(tokenizer, messages, add_generation_prompt=False, tools=tools, where=where)
    weights = [0.0] * len(full)
    if train_on == "all":
        weights = [1.0] * len(full)
    else:
        assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not assistant_turns:
            raise DataError(f"{where}: no assistant message to train on")
        if train_on == "last_assistant":
            assistant_turns = assistant_turns[-1:]
        elif train_on != "assistant":
            raise DataError(f"{where}: train_on={train_on!r} must be 'assistant', 'last_assistant' or 'all'")
        for k in assistant_turns:
            start_ids = _turn_ids(tokenizer, messages[:k], True, tools, where) if k else []
            end_ids = _turn_ids(tokenizer, messages[: k + 1], False, tools, where)
            if full[: len(end_ids)] != end_ids or end_ids[: len(start_ids)] != start_ids:
                raise DataError(f"{where}: the chat template does not render turn {k} as a prefix of the conversation")
            for i in range(len(start_ids), len(end_ids)):
                weights[i] = 1.0
    return Rendered(tokens=full, weights=weights)


def _turn_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]], open_: bool, tools: Any, where: str) -> List[int]:
    """Ids of ``messages``, ending with an open assistant turn when ``open_``."""
    return render_ids(tokenizer, messages, add_generation_prompt=open_, tools=tools, where=where)


def datum_from_tokens(tokens: Sequence[int], weights: Sequence[float]) -> Datum:
    """A cross-entropy datum: position *i* predicts token *i+1* with the weight of token *i+1*."""
    tokens = list(tokens)
    if len(tokens) < 2:
        raise DataError("a training sequence needs at least 2 tokens")
    shifted = list(weights[1:]) + [0.0]
    return Datum(
        model_input=ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": shifted},
    )


def conversation_datum(tokenizer: Any, messages: Sequence[Message], **kwargs: Any) -> Datum:
    """``render_conversation`` then ``datum_from_tokens``."""
    rendered = render_conversation(tokenizer, messages, **kwargs)
    return datum_from_tokens(rendered.tokens, rendered.weights)
