"""Sampled token ids -> the text, finish reason and per-token logprob entries of a chat choice.

The text of a completion is cut into one *piece* per token (incremental decoding with a short
window, the way vLLM does it: a token that ends inside a multi-byte character gets an empty piece
and the character goes to the token that completes it), so a streamed response is the exact
concatenation of its pieces and a stop sequence can be located in tokens as well as in text.

OpenAI semantics: the text ends *before* the first stop sequence (which is not returned); the
end-of-turn token is not part of the text or of ``logprobs.content``, but it is a generated token
and counts in ``usage.completion_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Dict, List, Optional, Sequence

_WINDOW = 6


@lru_cache(maxsize=1)
def _byte_decoder() -> Dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` (byte-level BPE token strings -> raw bytes)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenText:
    """Text helpers bound to one tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.special = set(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = backend is not None and "ByteLevel" in type(getattr(backend, "decoder", None)).__name__

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def token_str(self, token: int) -> str:
        return self.tokenizer.decode([int(token)], skip_special_tokens=False)

    def token_bytes(self, token: int) -> bytes:
        if self.byte_level:
            piece = self.tokenizer.convert_ids_to_tokens(int(token))
            decoder = _byte_decoder()
            if isinstance(piece, str) and all(c in decoder for c in piece):
                return bytes(decoder[c] for c in piece)
        return self.token_str(token).encode("utf-8")

    def pieces(self, tokens: Sequence[int]) -> List[str]:
        """One text piece per token; ``"".join(pieces)`` is the decoded text."""
        out: List[str] = []
        prefix, read = 0, 0  # tokens[prefix:read] is decoded context already emitted
        for i in range(len(tokens)):
            start = max(prefix, read - _WINDOW)
            before = self.decode(tokens[start:read])
            after = self.decode(tokens[start : i + 1])
            if len(after) > len(before) and not after.endswith("\ufffd"):
                out.append(after[len(before):])
                prefix, read = read, i + 1
            else:
                out.append("")
        if read < len(tokens):  # a trailing partial character: emit what decoding gives
            start = max(prefix, read - _WINDOW)
            tail = self.decode(tokens[start:])[len(self.decode(tokens[start:read])):]
            out[-1] = tail
        return out


@dataclass
class ChoiceText:
    """One choice, post-processed."""

    text: str
    finish_reason: str  # "stop" | "length"
    pieces: List[str]  # per kept token
    tokens: List[int]  # kept tokens (no end-of-turn token, nothing after a stop sequence)
    logprobs: List[float] = field(default_factory=list)
    generated: int = 0  # tokens the model generated (usage)


def finish_choice(tt: TokenText, tokens: Sequence[int], logprobs: Optional[Sequence[float]], stopped: bool, stops: Sequence[str]) -> ChoiceText:
    """Text, finish reason and kept tokens of one sampled sequence.

    ``stopped``: the sampler ended the sequence on a stop token or sequence (not on the length).
    """
    tokens = list(tokens)
    lps = list(logprobs or [0.0] * len(tokens))
    generated = len(tokens)
    while tokens and tokens[-1] in tt.special:  # the end-of-turn token is not content
        tokens.pop()
        lps.pop()
    pieces = tt.pieces(tokens)
    finish = "stop" if stopped else "length"
    text = "".join(pieces)
    if stops:
        longest = max(len(s) for s in stops)
        acc = ""
        for k, piece in enumerate(pieces):
            acc += piece
            if not piece:
                continue
            window_start = max(0, len(acc) - len(piece) - longest + 1)
            found = [i for i in (acc.find(s, window_start) for s in stops) if i >= 0]
            if found:
                cut = min(found)
                text, finish = acc[:cut], "stop"
                # keep the tokens whose text lies (at least partly) before the cut
                keep, pos = 0, 0
                for j, p in enumerate(pieces[: k + 1]):
                    if p and pos < cut:
                        keep = j + 1
                    pos += len(p)
                tokens, lps, pieces = tokens[:keep], lps[:keep], pieces[:keep]
                if pieces:
                    pieces[-1] = pieces[-1][: len(pieces[-1]) - (sum(map(len, pieces)) - cut)]
                break
    return ChoiceText(text=text, finish_reason=finish, pieces=pieces, tokens=tokens, logprobs=lps, generated=generated)


def logprob_entry(tt: TokenText, token: int, logprob: float, top: Optional[List[tuple]] = None) -> Dict[str, Any]:
    """One ``logprobs.content`` item: ``{token, logprob, bytes, top_logprobs}``."""
    return {
        "token": tt.token_str(token),
        "logprob": float(logprob),
        "bytes": list(tt.token_bytes(token)),
        "top_logprobs": [
            {"token": tt.token_str(t), "logprob": float(lp), "bytes": list(tt.token_bytes(t))} for t, lp in (top or [])
        ],
    }
