"""Preference pairs for DPO: records -> (prompt, chosen, rejected) -> two token sequences.

A pair record is turned into ``{"prompt": messages, "chosen": messages, "rejected": messages}``
by :func:`pair_builder` (fields, or a ``module:function`` transform such as
:func:`gsm8k_preference_pair`). Every pair is checked when the data loads, before any model is
loaded: a response that is empty, or a chosen equal to its rejected, is refused with its file and
line. Rendering (:class:`PairSet`) goes through the tokenizer's own chat template: the prompt,
then the response's assistant turn(s); loss weights are 1 on the response tokens only (its
end-of-turn token included), so the same prompt tokens are shared by both sides of a pair.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from rlkit.chat import check_messages, prompt_tokens, render_conversation
from rlkit.data import gsm8k_solution
from rlkit.errors import DataError
from rlkit.types import Datum, ModelInput

Messages = List[Dict[str, str]]


@dataclass
class Pair:
    prompt: Messages
    chosen: Messages
    rejected: Messages


def _as_messages(value: Any, role: str, where: str, name: str) -> Messages:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: '{name}' is empty")
        return [{"role": role, "content": value}]
    if isinstance(value, (list, tuple)):
        messages = check_messages(value, f"{where}: '{name}'")
        if not any(m["content"].strip() for m in messages):
            raise DataError(f"{where}: '{name}' is empty")
        return messages
    raise DataError(f"{where}: '{name}' must be a string or a list of messages, got {type(value).__name__}")


def check_pair(raw: Mapping[str, Any], where: str, system_prompt: Optional[str] = None) -> Pair:
    """A :class:`Pair` from ``{"prompt", "chosen", "rejected"}``, or a :class:`DataError` naming ``where``."""
    for key in ("prompt", "chosen", "rejected"):
        if key not in raw or raw[key] is None:
            raise DataError(f"{where}: no '{key}' (a preference pair needs prompt, chosen and rejected)")
    prompt = _as_messages(raw["prompt"], "user", where, "prompt")
    if system_prompt and prompt[0]["role"] != "system":
        prompt = [{"role": "system", "content": system_prompt}, *prompt]
    chosen = _as_messages(raw["chosen"], "assistant", where, "chosen")
    rejected = _as_messages(raw["rejected"], "assistant", where, "rejected")
    if chosen == rejected:
        raise DataError(f"{where}: chosen and rejected are identical (a pair must differ)")
    return Pair(prompt, chosen, rejected)


def pair_builder(fmt: Any) -> Tuple[Callable[[Mapping[str, Any]], Mapping[str, Any]], Dict[str, type]]:
    """``record -> {"prompt", "chosen", "rejected"}`` and the schema records must satisfy."""
    transform = getattr(fmt, "transform", None)
    if transform:
        from rlkit.config import import_string

        fn = import_string(transform)
        return fn, getattr(fn, "schema", None) or {}
    p, c, r = fmt.prompt_field, fmt.chosen_field, fmt.rejected_field
    return (lambda rec: {"prompt": rec.get(p), "chosen": rec.get(c), "rejected": rec.get(r)}), {}


def load_pairs(records: Sequence[Mapping[str, Any]], where: Sequence[str], fmt: Any) -> List[Pair]:
    """Every record as a checked :class:`Pair` (errors name the record's file and line)."""
    build, _ = pair_builder(fmt)
    pairs = []
    for record, location in zip(records, where):
        try:
            raw = build(record)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, DataError):
                raise DataError(f"{location}: {exc}") from None
            raise DataError(f"{location}: cannot build a preference pair ({exc!r})") from None
        pairs.append(check_pair(raw, location, getattr(fmt, "system_prompt", None)))
    return pairs


# -- rendering ----------------------------------------------------------------------------------------


def render_response(tokenizer: Any, prompt: Messages, response: Messages, max_length: int, where: str) -> Tuple[List[int], List[float]]:
    """Tokens of ``prompt + response`` and per-token weights (1 on the response's assistant tokens)."""
    prompt_ids = prompt_tokens(tokenizer, prompt)
    rendered = render_conversation(tokenizer, prompt + response, train_on="assistant", where=where)
    tokens, weights = rendered.tokens, list(rendered.weights)
    if tokens[: len(prompt_ids)] != prompt_ids:
        raise DataError(f"{where}: the chat template does not render the prompt as a prefix of the conversation")
    weights[: len(prompt_ids)] = [0.0] * len(prompt_ids)
    tokens, weights = tokens[:max_length], weights[:max_length]
    if not any(weights[1:]):
        raise DataError(f"{where}: the response has no tokens left after truncation to max_length={max_length}")
    return tokens, weights


def pair_datum(tokens: Sequence[int], weights: Sequence[float], ref_logprobs: Sequence[Optional[float]]) -> Datum:
    """A DPO datum: shifted targets/weights and the reference's logprob of each target token.

    ``ref_logprobs`` is ``compute_logprobs(tokens)`` (one per token, the first ``None``); position
    *i* carries the logprob of token *i+1*."""
    tokens = list(tokens)
    ref = [float(x) for x in list(ref_logprobs)[1:]] + [0.0]
    return Datum(
        model_input=ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": list(weights[1:]) + [0.0], "ref_logprobs": ref},
    )


class PairSet:
    """Pairs rendered on first use and cached: ``get(i) -> ((chosen tokens, weights), (rejected ...))``."""

    def __init__(self, pairs: Sequence[Pair], locations: Sequence[str], tokenizer: Any, max_length: int):
        self.pairs, self.locations, self.tokenizer, self.max_length = list(pairs), list(locations), tokenizer, max_length
        self._cache: Dict[int, Tuple[Tuple[List[int], List[float]], Tuple[List[int], List[float]]]] = {}

    def __len__(self) -> int:
        return len(self.pairs)

    def get(self, i: int):
        if i not in self._cache:
            p, where = self.pairs[i], self.locations[i]
            chosen = render_response(self.tokenizer, p.prompt, p.chosen, self.max_length, where)
            rejected = render_response(self.tokenizer, p.prompt, p.rejected, self.max_length, where)
            if chosen[0] == rejected[0]:
                raise DataError(f"{where}: chosen and rejected render to the same tokens (max_length={self.max_length})")
            self._cache[i] = (chosen, rejected)
        return self._cache[i]


# -- GSM8K pairs ---------------------------------------------------------------------------------------

_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)


def _number_pattern(value: str) -> re.Pattern:
    return re.compile(r"(?<![\d.,])" + re.escape(value) + r"(?![\d]|[.,]\d)")


def corrupt_number(value: str, key: str) -> str:
    """A different number near ``value``, chosen deterministically from ``key``."""
    digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    offsets = (1, -1, 2, -2, 3, 10, -10, 5)
    number = float(value.replace(",", ""))
    for k in range(len(offsets)):
        candidate = number + offsets[(digest + k) % len(offsets)]
        if candidate >= 0 or number < 0:
            text = str(int(candidate)) if candidate == int(candidate) else f"{candidate:g}"
            if text != value.replace(",", ""):
                return text
    return str(int(number) + 1)


def gsm8k_preference_pair(record: Mapping[str, Any], *, corrupt_working: bool = False) -> Dict[str, Any]:
    """GSM8K ``{question, answer}`` -> prompt = the question; chosen = the reference solution;
    rejected = the same solution with its final ``#### N`` line changed to a nearby wrong number
    (deterministic per question). The working is left intact, so the rejected answer contradicts
    the solution's own last step: DPO learns to prefer the answer that follows from the working.
    With ``corrupt_working`` the last occurrence of ``N`` in the working changes too, so the
    rejected solution is self-consistent but arithmetically wrong (a much harder preference)."""
    solution = gsm8k_solution(record["answer"]).strip()
    match = _FINAL.search(solution)
    if match is None:
        raise ValueError("the answer has no '#### N' line")
    final = match.group(1).strip()
    wrong = corrupt_number(final, record["question"])
    body = solution[: match.start()]
    if corrupt_working:
        hits = list(_number_pattern(final).finditer(body)) or list(_number_pattern(final.replace(",", "")).finditer(body))
        if hits:
            body = body[: hits[-1].start()] + wrong + body[hits[-1].end():]
    return {"prompt": record["question"], "chosen": solution, "rejected": body + "#### " + wrong}


def gsm8k_preference_pair_consistent(record: Mapping[str, Any]) -> Dict[str, Any]:
    """:func:`gsm8k_preference_pair` with ``corrupt_working=True``."""
    return gsm8k_preference_pair(record, corrupt_working=True)


gsm8k_preference_pair.schema = {"question": str, "answer": str}  # type: ignore[attr-defined]
gsm8k_preference_pair_consistent.schema = {"question": str, "answer": str}  # type: ignore[attr-defined]
