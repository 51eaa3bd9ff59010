"""Micro-batch planning for the local engine, with shared-prompt ("prefix") grouping.

RL batches hold G completions of each prompt. Their datums share the prompt tokens exactly, so
the engine runs the prompt once and attaches every completion to its key/value cache (gradients
flow back through the shared cache; the result is identical to running each datum alone). Datums
that agree on at least ``min_shared`` leading tokens (and on those positions' targets and
temperatures) form a :class:`Unit` with a shared prefix. The prefix is found from the tokens alone,
not from the loss weights, so scoring passes (``forward`` with zero weights, reference logprobs,
the first half of the linearised loss path) share prompts as training passes do.

Units are packed into micro-batches whose padded cost — prefix + rows x longest suffix, or rows x
longest sequence — stays within the token budget. A shared-prefix unit larger than the budget is
a micro-batch of its own that runs in parts of ``rows_per_part`` rows, its prompt once
(:mod:`.prompt_split`).
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
    rows_per_part: int = 0  # > 0: over the budget; runs in parts of this many rows, its prompt once

    def cost(self) -> int:
        """Padded tokens computed at once (for a unit run in parts: its prompt and its largest part)."""
        if self.prefix_len:
            rows = self.rows_per_part or len(self.indices)
            return self.prefix_len + min(rows, len(self.indices)) * max(n - self.prefix_len for n in self.lengths)
        return len(self.indices) * max(self.lengths)


def right_padded(seqs: Sequence[Sequence[int]], pad_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token lists as one right-padded batch: ``ids`` ``[N, W]`` (``pad_id`` after each list's
    end) and its attention ``mask`` ``[N, W]`` (1 on tokens, 0 on padding); ``W`` the longest list."""
    width = max(len(t) for t in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, t in enumerate(seqs):
        ids[i, : len(t)] = torch.tensor(t, dtype=torch.long)
        mask[i, : len(t)] = 1
    return ids, mask


def _shared_inputs(d: Datum) -> Tuple[List[int], Any]:
    """The per-position inputs a shared prefix must agree on besides tokens: targets, temperatures."""
    temps = datum_input(d, "temperature").tolist() if "temperature" in d.loss_fn_inputs else None
    return datum_input(d, "target_tokens", dtype=torch.long).tolist(), temps


def _agreement(ta: List[int], tb: List[int], a: Tuple[List[int], Any], b: Tuple[List[int], Any]) -> int:
    """How many leading positions two datums can share: equal tokens, equal targets on all but the
    last shared position (its target is each member's own), equal temperatures."""
    n = min(_common(ta, tb), _common(a[0], b[0]) + 1)
    if (a[1] is None) != (b[1] is None):
        return 0
    return n if a[1] is None else min(n, _common(a[1], b[1]))


def _common(x: Sequence[Any], y: Sequence[Any]) -> int:
    n = min(len(x), len(y))
    i = 0
    while i < n and x[i] == y[i]:
        i += 1
    return i


def make_units(data: Sequence[Datum], min_shared: int = 16) -> List[Unit]:
    """Group datums that share a leading run of tokens into units (see the module docstring).

    Datums are sorted by their tokens, so datums with a common prefix are neighbours and the prefix
    a run of them shares is the smallest agreement between neighbours. A run is split at its
    weakest links whenever that lowers its padded cost (e.g. two prompts that share only a
    chat-template header become two units, each sharing its whole prompt)."""
    tokens = [d.model_input.to_ints() for d in data]
    lengths = [len(t) for t in tokens]
    order = sorted(range(len(data)), key=lambda i: tokens[i])
    inputs = [_shared_inputs(d) for d in data]
    agree = [_agreement(tokens[a], tokens[b], inputs[a], inputs[b]) for a, b in zip(order, order[1:])]
    units: List[Unit] = []

    def single(k: int) -> Tuple[int, List[Unit]]:
        i = order[k]
        return lengths[i], [Unit([i], 0, [lengths[i]])]

    def best(lo: int, hi: int, depth: int = 0) -> Tuple[int, List[Unit]]:
        """Cheapest grouping of ``order[lo:hi]`` (a run whose neighbours agree on >= min_shared)."""
        if hi - lo == 1:
            return single(lo)
        members = [order[k] for k in range(lo, hi)]
        weakest = min(agree[lo : hi - 1])
        p = min(weakest, min(lengths[i] for i in members) - 1)  # every member keeps a suffix
        whole = (p + len(members) * max(lengths[i] - p for i in members), [Unit(members, p, [lengths[i] for i in members])]) if p >= min_shared else None
        if depth > 64:
            return whole or (sum(lengths[i] for i in members), [single(k)[1][0] for k in range(lo, hi)])
        cuts = [k + 1 for k in range(lo, hi - 1) if agree[k] == weakest]
        cost, parts = 0, []
        for a, b in zip([lo, *cuts], [*cuts, hi]):
            c, u = best(a, b, depth + 1)
            cost, parts = cost + c, parts + u
        return whole if whole is not None and whole[0] <= cost else (cost, parts)

    lo = 0
    for k in range(len(order)):
        if k == len(order) - 1 or agree[k] < min_shared:
            units += best(lo, k + 1)[1]
            lo = k + 1
    return units


def plan_micro_batches(data: Sequence[Datum], budget: int, min_shared: int = 16) -> List[List[Unit]]:
    """Units packed into micro-batches of padded cost <= ``budget``. A shared-prefix unit over the
    budget is a micro-batch of its own, run in parts (``rows_per_part``); a lone oversized datum
    runs alone."""
    units: List[Unit] = []
    batches: List[List[Unit]] = []
    for unit in make_units(data, min_shared):
        if unit.prefix_len and unit.cost() > budget and len(unit.indices) > 1:
            suffix = max(n - unit.prefix_len for n in unit.lengths)
            unit.rows_per_part = max(1, (budget - unit.prefix_len) // max(suffix, 1))
            batches.append([unit])
        else:
            units.append(unit)
    shared = [u for u in units if u.prefix_len]
    plain = sorted((u for u in units if not u.prefix_len), key=lambda u: u.lengths[0])
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


def padded_tokens(units: Sequence[Unit]) -> int:
    """Tokens a micro-batch computes, padding included: each shared-prefix unit's cost, plus the
    plain rows padded together to the longest of them."""
    plain = [n for u in units if not u.prefix_len for n in u.lengths]
    return sum(u.cost() for u in units if u.prefix_len) + len(plain) * max(plain, default=0)


def merge_metrics(total: Dict[str, float], part: Dict[str, float], weights: Dict[str, float]) -> None:
    """Sum ``:sum`` metrics and counts; average ``:mean`` metrics by weighted tokens — the count of
    the metric's own namespace (``ppo/tokens:weighted`` for ``ppo/clip_frac:mean`` in a composite
    loss), else the micro-batch's, else each micro-batch counts once (a loss that reports no count)."""
    for key, value in part.items():
        if key.endswith(":mean"):
            namespace = key.rpartition("/")[0]
            n = part.get(f"{namespace}/tokens:weighted" if namespace else "tokens:weighted", part.get("tokens:weighted", 1.0))
            if n:
                prev_n = weights.get(key, 0.0)
                total[key] = (total.get(key, 0.0) * prev_n + value * n) / (prev_n + n)
                weights[key] = prev_n + n
        else:
            total[key] = total.get(key, 0.0) + value


def prefill_parts(keys: Sequence[Any], lengths: Sequence[int], budget: int) -> List[List[int]]:
    """Sampling requests' indices in prefill parts (the sampler's ``_prefill``): all in one part when
    their distinct prompts (``keys``: equal keys share a prompt of ``lengths``) padded to the longest
    come to at most ``budget`` tokens; else distinct prompts by length, shortest first, each part as
    many as fit ``budget`` padded to its own longest (at least one), a prompt's requests together.
    Indices ascend within a part."""
    groups: Dict[Any, List[int]] = {}
    for j, key in enumerate(keys):
        groups.setdefault(key, []).append(j)
    length = {key: lengths[members[0]] for key, members in groups.items()}
    if not groups or len(groups) * max(length.values()) <= budget:
        return [list(range(len(keys)))]
    parts: List[List[int]] = []
    count = 0
    for key in sorted(groups, key=lambda k: length[k]):
        if not parts or (count + 1) * length[key] > budget:
            parts.append([])
            count = 0
        parts[-1] += groups[key]
        count += 1
    return [sorted(part) for part in parts]
