"""Is a chat template prefix-stable? Compare the turn-by-turn token stream with a fresh render.

An agent's context grows turn by turn: the prompt, the sampled assistant tokens, the tokens the
environment appends (:meth:`~rlkit.tools.render.ToolRenderer.continuation`), the next sampled
turn... Training must use exactly that stream (the tokens the sampler saw and produced). If the
template renders the *whole* conversation differently — Qwen3-style templates drop earlier
turns' ``<think>`` blocks, some templates close a run of tool messages only after the last one —
then "re-render the conversation and train on it" trains on tokens the sampler never saw.

:func:`check_prefix_stability` builds the stream the way :class:`~rlkit.tasks.tools.ToolEnv` does
(each assistant turn as the template itself renders it, through its end-of-turn token) and
compares it with ``render(conversation)``: it returns where they first differ and both sides'
text there. What rlkit does about a difference: nothing needs re-rendering — rollouts keep the
sampled stream and train on it — so an unstable template is safe for RL; it matters where a
conversation is rendered afresh (SFT on transcripts, serving a conversation), and the report says
where. ``ToolEnv(strip_reasoning=True)`` removes ``<think>`` blocks from the *context* of later
turns (on request only); each turn is then trained in the context it was sampled in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

from rlkit.tools.render import ToolRenderer, normalize_messages


@dataclass
class PrefixReport:
    stable: bool
    position: Optional[int] = None  # first token where stream and fresh render differ
    message: Optional[int] = None  # the assistant turn whose tokens (or what follows) differ
    stream: str = ""  # text of the stream from shortly before the difference
    fresh: str = ""  # text of the fresh render there
    stream_tokens: int = 0
    fresh_tokens: int = 0

    def __str__(self) -> str:
        if self.stable:
            return f"prefix-stable ({self.stream_tokens} tokens)"
        return (
            f"not prefix-stable at token {self.position} (assistant turn {self.message}): "
            f"turn by turn {self.stream!r} vs fresh render {self.fresh!r}"
        )


def incremental_stream(renderer: ToolRenderer, messages: Sequence[Mapping[str, Any]]) -> tuple[List[int], List[int]]:
    """``(tokens, starts)``: the turn-by-turn stream of ``messages`` and, per assistant turn, where its tokens start."""
    messages = normalize_messages(messages)
    k = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if k is None:
        return renderer.prompt(messages), []
    stream = renderer.prompt(messages[:k])
    history: List[Mapping[str, Any]] = list(messages[:k])
    starts: List[int] = []
    while k < len(messages):
        turn = renderer.turn_tokens(history, messages[k])
        starts.append(len(stream))
        stream += turn
        j = k + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j < len(messages):
            stream += renderer.continuation(history, messages[k + 1 : j], turn)
        history += messages[k:j]
        k = j
    return stream, starts


def check_prefix_stability(
    renderer: ToolRenderer, messages: Sequence[Mapping[str, Any]], context: int = 12
) -> PrefixReport:
    """Whether the turn-by-turn stream of ``messages`` is a prefix of their fresh render, and the
    fresh render only adds the template's closing tokens after the last turn's end-of-turn token."""
    stream, starts = incremental_stream(renderer, messages)
    fresh = renderer.render(messages, train_on="all").tokens
    n = min(len(stream), len(fresh))
    pos = next((i for i in range(n) if stream[i] != fresh[i]), None)
    if pos is None and len(stream) > len(fresh):
        pos = len(fresh)
    if pos is None:
        return PrefixReport(True, stream_tokens=len(stream), fresh_tokens=len(fresh))
    turn = max((i for i, s in enumerate(starts) if s <= pos), default=None)
    decode = renderer.tokenizer.decode
    lo = max(0, pos - context)
    return PrefixReport(
        False, pos, turn, decode(stream[lo : pos + context]), decode(fresh[lo : pos + context]), len(stream), len(fresh)
    )
