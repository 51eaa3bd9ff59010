"""A group's shared prompt once, in one decoder pass: the prompt and its members' completions packed.

The one-process engine can run a shared-prefix unit (:mod:`.batching`) in two decoder passes: the
prompt, then every member's suffix against the prompt's key/value cache; or packed into one row, in
one pass — whichever its FLOP estimate says is cheaper (:mod:`.layout`: short completions pack). On
N ranks (:mod:`.distributed`) every rank must run the same decoder passes — each FSDP2 layer's
all-gather is a collective — so there a micro-batch is always **one** pass, and a unit one row::

    row  = prompt · suffix_1 · suffix_2 · ... · suffix_G
    position ids: 0 .. P-1, then P .. P+len_k-1 again for each suffix k
    mask[q, k] = k <= q and (segment(k) == segment(q) or segment(k) is the prompt)

— each suffix attends to the prompt and to itself, causally: exactly the attention of
``prompt + suffix_k`` run alone (the same product as the cache path, up to float rounding), with
the prompt computed once. A datum with no shared prefix is a row of one segment (plain causal).
Rows are right-padded; padding positions are a segment of their own, read by no real token. The mask
goes to the model as a boolean ``[rows, 1, L, L]`` 4D attention mask (Hugging Face's custom-mask
path; SDPA or eager attention, not flash-attention).

The cost beside the cache path: attention over the packed row computes the whole ``L x L`` masked
product (for 8 suffixes of 120 tokens on a 200-token prompt, ~20% more FLOPs on SmolLM2's shapes),
while every linear layer sees each prompt token once.

Planning (:func:`plan`): every unit is a row of its packed length; rows are packed into micro-batches
of ``rows x longest row <= budget`` (sorted by length, so padding stays low); a unit whose packed
row is over the budget is split into parts of whole members, each repeating the prompt (no
``rows_per_part`` multi-pass split: that runs several passes).
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple, TypeVar

import torch

from rlkit.backends.local.batching import Unit, make_units
from rlkit.types import Datum

T = TypeVar("T")


def packed_len(unit: Unit) -> int:
    """The length of a unit's packed row (a plain unit: its one datum)."""
    if not unit.prefix_len:
        return max(unit.lengths)
    return unit.prefix_len + sum(n - unit.prefix_len for n in unit.lengths)


def split(unit: Unit, budget: int) -> List[Unit]:
    """``unit`` as parts whose packed rows fit ``budget`` (whole members, the prompt in each; at least
    one member per part)."""
    if not unit.prefix_len or packed_len(unit) <= budget or len(unit.indices) == 1:
        return [unit]
    parts: List[Unit] = []
    current: List[int] = []
    length = unit.prefix_len
    for i, n in zip(unit.indices, unit.lengths):
        suffix = n - unit.prefix_len
        if current and length + suffix > budget:
            parts.append(current)
            current, length = [], unit.prefix_len
        current.append(i)
        length += suffix
    parts.append(current)
    lengths = dict(zip(unit.indices, unit.lengths))
    return [Unit(p, unit.prefix_len, [lengths[i] for i in p]) for p in parts]


def fill(items: Sequence[T], length: Callable[[T], int], budget: int) -> List[List[T]]:
    """``items`` (each one packed row of ``length(item)`` tokens) in micro-batches of
    ``rows x longest row <= budget``, shortest rows first so padding stays low (a row over the
    budget is a micro-batch of its own)."""
    batches: List[List[T]] = []
    current: List[T] = []
    width = 0
    for item in sorted(items, key=length):
        n = length(item)
        if current and (len(current) + 1) * max(width, n) > budget:
            batches.append(current)
            current, width = [], 0
        current.append(item)
        width = max(width, n)
    if current:
        batches.append(current)
    return batches


def plan(data: Sequence[Datum], budget: int, min_shared: int) -> List[List[Unit]]:
    """Units (split to the budget) packed into micro-batches (:func:`fill`), each micro-batch one
    decoder pass."""
    return fill([part for u in make_units(data, min_shared) for part in split(u, budget)], packed_len, budget)


Segments = List[Tuple[int, int]]  # (start, end) of the prompt (shared rows) and each member's tokens


def packed_inputs(rows: Sequence[Tuple[int, List[List[int]]]], pad_id: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[Segments]]:
    """``rows``: ``(prefix_len, members' tokens)`` per row (prefix_len 0: one member, plain).
    Returns ``input_ids`` ``[R, L]``, ``position_ids`` ``[R, L]``, the boolean attention mask
    ``[R, 1, L, L]`` (True: attend) and each row's segments: for a shared row the prompt's span then
    each member's suffix span; for a plain row the datum's span."""
    flat: List[List[int]] = []
    positions: List[List[int]] = []
    segment_ids: List[List[int]] = []
    spans: List[Segments] = []
    for prefix_len, members in rows:
        if not prefix_len:
            (tokens,) = members
            flat.append(list(tokens))
            positions.append(list(range(len(tokens))))
            segment_ids.append([0] * len(tokens))
            spans.append([(0, len(tokens))])
            continue
        ids, pos, seg, row_spans = list(members[0][:prefix_len]), list(range(prefix_len)), [0] * prefix_len, [(0, prefix_len)]
        for k, tokens in enumerate(members, 1):
            suffix = list(tokens[prefix_len:])
            row_spans.append((len(ids), len(ids) + len(suffix)))
            ids += suffix
            pos += list(range(prefix_len, prefix_len + len(suffix)))
            seg += [k] * len(suffix)
        flat.append(ids)
        positions.append(pos)
        segment_ids.append(seg)
        spans.append(row_spans)
    width = max(len(r) for r in flat)
    input_ids = torch.full((len(flat), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(flat), width), dtype=torch.long)
    segments = torch.full((len(flat), width), -1, dtype=torch.long)  # padding: a segment no real token reads
    for r, (ids, pos, seg) in enumerate(zip(flat, positions, segment_ids)):
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        position_ids[r, : len(pos)] = torch.tensor(pos, dtype=torch.long)
        segments[r, : len(seg)] = torch.tensor(seg, dtype=torch.long)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)
    mask = causal & ((key == query) | (key == 0))
    return input_ids, position_ids, mask.unsqueeze(1), spans
