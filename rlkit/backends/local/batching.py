"""Micro-batch planning for the local engine, with shared-prompt ("prefix") grouping.

RL batches hold G completions of each prompt. Their datums share the prompt tokens exactly, so
the engine runs the prompt once and attaches every completion to its key/value cache (gradients
flow back through the shared cache; the result is identical to running each datum alone). A
datum's prompt is its tokens up to and including the position of its first non-zero weight (that
position predicts the first trained token); datums whose prompts are equal and at least
``min_shared`` tokens long form a :class:`Unit` with a shared prefix.

Units are packed into micro-batches whose padded cost — prefix + rows x longest suffix, or rows x
longest sequence — stays within the token budget; a unit larger than the budget is split by rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import torch

from rlkit.losses.base import datum_input
from rlkit.types import Datum


@dataclass
class Unit:
    indices: List[int]
    prefix_len: int  # 0 = no shared prefix: the datums run as ordinary padded rows
    lengths: List[int]

    def cost(self) -> int:
        if self.prefix_len:
            return self.prefix_len + len(self.indices) * max(n - self.prefix_len for n in self.lengths)
        return len(self.indices) * max(self.lengths)


def prompt_length(datum: Datum) -> int:
    """Tokens up to and including the first position with a non-zero weight."""
    weights = datum_input(datum, "weights")
    nonzero = (weights != 0).nonzero()
    n = datum.model_input.length
    return int(nonzero[0, 0]) + 1 if len(nonzero) else n


def make_units(data: Sequence[Datum], min_shared: int = 16) -> List[Unit]:
    shared: Dict[Tuple[Any, ...], List[int]] = {}
    singles: List[int] = []
    for i, d in enumerate(data):
        p = prompt_length(d)
        if p >= min_shared and p < d.model_input.length:
            # members must agree on everything the shared prefix computes: tokens, the targets
            # of its first p-1 positions, and their temperatures
            key = (
                tuple(d.model_input.to_ints()[:p]),
                tuple(datum_input(d, "target_tokens", dtype=torch.long)[: p - 1].tolist()),
                tuple(datum_input(d, "temperature")[:p].tolist()) if "temperature" in d.loss_fn_inputs else None,
            )
            shared.setdefault(key, []).append(i)
        else:
            singles.append(i)
    units = []
    for key, idx in shared.items():
        if len(idx) == 1:
            singles += idx
        else:
            units.append(Unit(idx, len(key[0]), [data[i].model_input.length for i in idx]))
    for i in singles:
        units.append(Unit([i], 0, [data[i].model_input.length]))
    return units


def plan_micro_batches(data: Sequence[Datum], budget: int, min_shared: int = 16) -> List[List[Unit]]:
    """Units packed into micro-batches of padded cost <= ``budget`` (a lone oversized datum runs alone)."""
    units: List[Unit] = []
    for unit in make_units(data, min_shared):
        if unit.prefix_len and unit.cost() > budget and len(unit.indices) > 1:
            suffix = max(n - unit.prefix_len for n in unit.lengths)
            rows = max(1, (budget - unit.prefix_len) // max(suffix, 1))
            for k in range(0, len(unit.indices), rows):
                units.append(Unit(unit.indices[k : k + rows], unit.prefix_len, unit.lengths[k : k + rows]))
        else:
            units.append(unit)
    shared = [u for u in units if u.prefix_len]
    plain = sorted((u for u in units if not u.prefix_len), key=lambda u: u.lengths[0])
    batches: List[List[Unit]] = []
    current: List[Unit] = []
    cost = 0
    for unit in shared:
        if current and cost + unit.cost() > budget:
            batches.append(current)
            current, cost = [], 0
        current.append(unit)
        cost += unit.cost()
    rows, width = 0, 0
    plain_batch: List[Unit] = []
    for unit in plain:  # sorted by length: padding stays low
        n = unit.lengths[0]
        if plain_batch and (rows + 1) * max(width, n) > budget:
            batches.append(plain_batch)
            plain_batch, rows, width = [], 0, 0
        plain_batch.append(unit)
        rows, width = rows + 1, max(width, n)
    if current:
        batches.append(current)
    if plain_batch:
        batches.append(plain_batch)
    return batches
