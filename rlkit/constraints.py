"""Constrained decoding: grammars and JSON schemas compiled to per-step token masks (llguidance).

A :class:`~rlkit.types.Constraint` (``SamplingParams.constraint``) is turned into an llguidance
grammar once per distinct constraint (:func:`grammar_of`, cached) and checked without a tokenizer
(:func:`check_constraint`: a schema that cannot be compiled is refused in one line naming where in
the schema, e.g. ``#/properties/unit``). For one tokenizer, :func:`compiled` builds the matcher
once per (tokenizer, grammar) and hands out cheap copies (``deep_copy``, ~1 µs), one per sample
row: :class:`RowMatchers` is what the local sampler keeps per request.

JSON is written compactly, as ``json.dumps`` writes it (``", "`` and ``": "``, no other
whitespace): the schema compiler's default lets a model pad with whitespace for ever, and a fixed
layout is what parsers downstream (``rlkit serve``'s tool calls) expect. A schema's own
``x-guidance`` options win.

llguidance is an optional dependency (the ``serve`` and ``dev`` extras); without it a constrained
request is refused in one line saying how to install it.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from rlkit.errors import InvalidInputError
from rlkit.types import Constraint

#: llguidance's JSON options rlkit uses (compact, as ``json.dumps`` writes)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SUBSCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                  "unevaluatedProperties", "unevaluatedItems")
_lock = threading.Lock()
_grammars: Dict[str, str] = {}
_errors: Dict[str, Optional[str]] = {}


def llguidance_module() -> Any:
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError as exc:
        raise InvalidInputError(
            f"constrained decoding needs llguidance: pip install 'rlkit[serve]' (or llguidance>=1.9) ({exc})"
        ) from None
    return llguidance


def _with_options(schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return schema
    options = {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}
    return {**schema, "x-guidance": options}


def lark_json(schema: Mapping[str, Any]) -> str:
    """``%json {...}``: ``schema`` (with rlkit's JSON layout) as a Lark grammar item."""
    return "%json " + json.dumps(_with_options(schema), ensure_ascii=False)


def lark_text(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _key(constraint: Constraint) -> str:
    return json.dumps(constraint.model_dump(exclude_none=True), sort_keys=True, ensure_ascii=False)


def grammar_of(constraint: Constraint) -> str:
    """The llguidance grammar of ``constraint`` (cached per distinct constraint). Does not check it."""
    key = _key(constraint)
    with _lock:
        if key in _grammars:
            return _grammars[key]
    llg = llguidance_module()
    M = llg.LLMatcher
    try:
        if constraint.json_schema is not None:
            grammar = M.grammar_from_json_schema(json.dumps(_with_options(constraint.json_schema)))
        elif constraint.lark is not None:
            grammar = M.grammar_from_lark(constraint.lark)
        else:
            grammar = M.grammar_from_regex(constraint.regex)
    except ValueError as exc:  # not a JSON object
        raise InvalidInputError(f"constraint: {exc}") from None
    with _lock:
        _grammars[key] = grammar
    return grammar


def _error(grammar: str) -> Optional[str]:
    llg = llguidance_module()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    return " ".join(messages[0].split()) if is_error else None


def schema_problem(schema: Any) -> Optional[Tuple[str, str]]:
    """``None`` when ``schema`` compiles, else ``(where, why)``: ``where`` a JSON pointer into the
    schema (``#/properties/unit``), the deepest sub-schema that fails on its own with the same error
    (sub-schemas are tried with the root's ``$defs`` / ``definitions``, so references resolve)."""
    if not isinstance(schema, Mapping):
        return "#", f"a JSON schema must be an object, got {type(schema).__name__}"
    llg = llguidance_module()

    def problem(node: Any) -> Optional[str]:
        try:
            return _error(llg.LLMatcher.grammar_from_json_schema(json.dumps(_with_options(node))))
        except (TypeError, ValueError) as exc:
            return str(exc)

    why = problem(schema)
    if why is None:
        return None
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    path: List[Tuple[str, ...]] = []
    node: Any = schema
    while True:
        for step, child in _children(node):
            if not isinstance(child, Mapping):
                continue
            trial = {**defs, **child} if defs else child
            if problem(trial) == why:
                path.append(step)
                node = child
                break
        else:
            break
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for step in path for p in step), why


def _children(node: Mapping[str, Any]):
    for key in _SUBSCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, Mapping):
            for name, child in value.items():
                yield (key, name), child
    for key in _SUBSCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            for i, child in enumerate(value):
                yield (key, i), child
    for key in _SUBSCHEMA_ONE:
        if key in node:
            yield (key,), node[key]


def check_constraint(constraint: Constraint, where: str = "sampling_params.constraint") -> str:
    """The grammar of ``constraint``, or :class:`~rlkit.errors.InvalidInputError` in one line naming
    what is wrong (for a JSON schema, where in it). Cached per distinct constraint."""
    grammar = grammar_of(constraint)
    with _lock:
        known = grammar in _errors
        why = _errors.get(grammar)
    if not known:
        why = _error(grammar)
        if why is not None and constraint.json_schema is not None:
            found = schema_problem(constraint.json_schema)
            if found is not None:
                why = f"the JSON schema cannot be compiled at {found[0]}: {found[1]}"
        with _lock:
            _errors[grammar] = why
    if why is not None:
        raise InvalidInputError(f"{where}: {why}")
    return grammar


# -- per tokenizer ------------------------------------------------------------------------------------

_tokenizers: "weakref.WeakKeyDictionary[Any, Dict[Tuple, Any]]" = weakref.WeakKeyDictionary()
_matchers: "weakref.WeakKeyDictionary[Any, Dict[Tuple, Any]]" = weakref.WeakKeyDictionary()


def end_tokens(tokenizer: Any, stop_token_ids: Sequence[int]) -> List[int]:
    """The end tokens a finished grammar allows: the sampler's stop tokens, else the tokenizer's EOS."""
    ids = sorted(int(t) for t in stop_token_ids)
    return ids or [int(tokenizer.eos_token_id)]


def ll_tokenizer(tokenizer: Any, n_vocab: int, eos: Sequence[int]) -> Any:
    """llguidance's view of ``tokenizer`` (a fast Hugging Face tokenizer) with ``n_vocab`` logits
    columns and ``eos`` as the end tokens a finished grammar allows (cached: ~1 s for a large vocabulary)."""
    llg = llguidance_module()
    key = (int(n_vocab), tuple(int(t) for t in eos))
    with _lock:
        cached = _tokenizers.setdefault(tokenizer, {}).get(key)
    if cached is None:
        eos_ids = list(key[1])
        cached = llg.hf.from_tokenizer(tokenizer, n_vocab=key[0], eos_token=eos_ids if len(eos_ids) > 1 else eos_ids[0])
        with _lock:
            _tokenizers[tokenizer][key] = cached
    return cached


def compiled(tokenizer: Any, n_vocab: int, eos: Sequence[int], constraint: Constraint) -> Any:
    """A pristine matcher of ``constraint`` for this tokenizer: built once, copied per use."""
    llg = llguidance_module()
    grammar = check_constraint(constraint)
    llt = ll_tokenizer(tokenizer, n_vocab, eos)
    key = (int(n_vocab), tuple(int(t) for t in eos), grammar)
    with _lock:
        matcher = _matchers.setdefault(tokenizer, {}).get(key)
    if matcher is None:
        matcher = llg.LLMatcher(llt, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidInputError(f"sampling_params.constraint: {matcher.get_error()}")
        with _lock:
            _matchers[tokenizer][key] = matcher
    return matcher


def unpack_bitmask(bits: torch.Tensor, n_vocab: int) -> torch.Tensor:
    """``[rows, ceil(V/32)]`` int32 bitmasks (bit ``j`` of word ``w`` = token ``32 w + j``) -> ``[rows, V]`` bool."""
    shifts = torch.arange(32, dtype=torch.int32)
    return ((bits.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :n_vocab]


#: a sample with at most this many tokens left checks that its grammar can still finish in time
FINISH_WINDOW = 64
#: ... and follows the finishing policy once that needs all but this many of them (one model token
#: can add several to what closing takes: a multi-byte character, an opened value)
FINISH_MARGIN = 8
_closers: "weakref.WeakKeyDictionary[Any, List[int]]" = weakref.WeakKeyDictionary()


def closing_tokens(tokenizer: Any) -> List[int]:
    """Single-character tokens in the order the finishing policy tries them: ``"``, ``}``, ``]``,
    ``,`` (they close what is open), then digits, letters and the other printable ASCII characters."""
    with _lock:
        cached = _closers.get(tokenizer)
    if cached is None:
        order = '"}],' + "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ :-.[{" + "".join(map(chr, range(33, 127)))
        cached, seen = [], set()
        for ch in order:
            ids = tokenizer.encode(ch, add_special_tokens=False)
            if len(ids) == 1 and ids[0] not in seen:
                seen.add(ids[0])
                cached.append(int(ids[0]))
        with _lock:
            _closers[tokenizer] = cached
    return cached


def _allows(bits: bytes, token: int) -> bool:
    return 0 <= token < 8 * len(bits) and bool((bits[token >> 3] >> (token & 7)) & 1)


class RowMatchers:
    """One request's matchers, one per sample row (made on first use from the compiled matcher).

    **Finishing in budget.** A grammar only says what may come next, not how long the text will be:
    a model may write a JSON string for ever. So a row with at most :data:`FINISH_WINDOW` tokens
    left simulates, on a copy of its matcher, a model-free *finishing policy* (a forced token if
    the grammar forces one, else an end token, else the first allowed of ``closers`` — ``"``, ``}``,
    ``]``, short tokens — else the first allowed token); once that policy needs all the tokens left
    but :data:`FINISH_MARGIN`, the row follows it to the end: the text is then complete within ``max_tokens``
    whenever the policy can close it in the budget, instead of being cut mid-value."""

    def __init__(self, pristine: Any, eos: Sequence[int], closers: Sequence[int] = ()):
        self.pristine = pristine
        self.eos = frozenset(int(t) for t in eos)
        self.closers = [*sorted(self.eos), *closers]
        self.rows: Dict[int, Any] = {}
        self.finishing: set = set()

    def _closing(self, m: Any) -> int:
        forced = m.compute_ff_tokens()
        if forced:
            return int(forced[0])
        bits = m.compute_bitmask()
        for t in self.closers:
            if _allows(bits, t):
                return t
        word = next((k for k, b in enumerate(bits) if b), None)
        return sorted(self.eos)[0] if word is None else 8 * word + (bits[word] & -bits[word]).bit_length() - 1

    def _steps_to_finish(self, m: Any, limit: int) -> int:
        """Tokens the finishing policy needs from ``m``'s state to a finished grammar (``limit`` if more)."""
        sim, steps = m.deep_copy(), 0
        while steps < limit and not sim.is_stopped() and not sim.is_error():
            token = self._closing(sim)
            steps += 1
            if token in self.eos or not sim.consume_token(token):
                break
        return steps

    def matcher(self, index: int) -> Any:
        if index not in self.rows:
            self.rows[index] = self.pristine.deep_copy()
        return self.rows[index]

    def allowed(self, indices: Sequence[int], n_vocab: int, left: Optional[Sequence[int]] = None) -> torch.Tensor:
        """``[len(indices), n_vocab]`` bool: the tokens each row's grammar allows next (``left``: each
        row's tokens left in its budget; a row near its end may be held to the finishing policy)."""
        words = (n_vocab + 31) // 32
        bits = torch.empty((len(indices), words), dtype=torch.int32)
        only: Dict[int, int] = {}
        for k, i in enumerate(indices):
            m = self.matcher(i)
            room = None if left is None else int(left[k])
            if room is not None and i not in self.finishing and room <= FINISH_WINDOW and not m.is_stopped():
                if self._steps_to_finish(m, room) >= room - FINISH_MARGIN:
                    self.finishing.add(i)
            if i in self.finishing and not m.is_stopped():
                only[k] = self._closing(m)
            m.unsafe_compute_mask_ptr(bits[k].data_ptr(), words * 4)
        mask = unpack_bitmask(bits, n_vocab)
        for k, token in only.items():
            mask[k] = False
            mask[k, token] = True
        empty = ~mask.any(-1)
        if bool(empty.any()):  # a matcher in an error state allows nothing: let it end instead of sampling NaN
            for k in empty.nonzero().flatten().tolist():
                mask[k, sorted(self.eos)] = True
        return mask

    def advance(self, index: int, token: int, stops: Sequence[int], last: bool) -> bool:
        """Consume ``token`` on row ``index``; ``True`` when that sample is complete: it took an end
        token, its matcher failed, or the grammar is finished and no end token would stop it (the
        request's ``stop_token_ids`` exclude them) or no token is left in the budget."""
        m = self.matcher(index)
        if not m.consume_token(int(token)) or int(token) in self.eos:
            return True
        return m.is_stopped() and (last or not (self.eos & set(stops)))
