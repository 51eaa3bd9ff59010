"""Which layout a one-process training pass runs its GRPO groups in: two passes or one packed pass.

A group's ``G`` completions of one ``p``-token prompt (a shared-prefix unit, :mod:`.batching`) can
run in two layouts, with the same numbers up to float rounding:

- **two passes** (:meth:`~.engine.TrainingEngine._shared_prefix_hidden`): the prompts, then every
  member's suffix against its prompt's key/value cache;
- **one packed pass** (:mod:`.packed`): each group a row ``prompt · suffix_1 · ... · suffix_G``
  under a block mask.

Both compute every prompt token once in the linear layers. They differ in attention — the packed
row's dense ``L x L`` masked product (``L = p + sum of suffixes``) against the cache path's
``p^2 + G s (p + s)`` — and in everything that is not FLOPs: the packed pass is one decoder pass
with larger products and no per-member cache gather. Estimated FLOPs, dense attention (the padding
and custom-mask paths compute every (query, key) pair)::

    cost(rows, width, keys) = rows * width * (linear + keys * attention)
    linear    = 2 x the decoder layers' weight-matrix parameters        (per token)
    attention = 4 x heads x head_dim x layers                           (per query-key pair)
    packed    = sum over micro-batches of cost(rows, longest packed row, same)
    two pass  = sum of cost(groups, widest prompt, same) + cost(members, widest suffix, prompt + suffix)
                (+ cost(rows, longest, same) for rows without a shared prompt)

:func:`choose` takes the packed layout when its estimate is at most :data:`PACKED_MARGIN` times the
two passes'. Measured (SmolLM2-135M, fp32, 2 CPU cores, ``forward_backward`` of one LoRA run,
median of 5; ``benchmarks/many_runs.py --core`` shapes), seconds two-pass vs packed and the
estimate's ratio packed / two-pass:

====================================  ============  ==========  ===============
shape (groups x members, prompt, s)   two passes    packed      FLOPs ratio
====================================  ============  ==========  ===============
2 x 4, 40-token prompt, 16            0.82          0.69        1.02
8 x 8, 128-token prompt, 6 (main job) 7.2           3.8         1.01
1 x 8, 200-token prompt, 120          4.1           4.5         1.25
1 x 8, 200-token prompt, 300          9.9           15.6        1.58
====================================  ============  ==========  ===============

At equal FLOPs the packed pass is the faster (1.2-1.9x here); where its attention adds a quarter
or more it is the slower, in proportion. The margin (1.1) sits between: short completions (RL on
short answers) pack, long ones (GSM8K-length reasoning) keep the cache path. The fused pass of
several runs (:func:`~.multi_lora.fused_run`) only has the packed layout, so an operation whose
packed estimate does not pay runs on its own engine instead (:mod:`.fusion`).

A model with sliding-window attention (Gemma 2/3, gpt-oss) packs only rows no longer than its
window: the block mask is the row's whole attention mask, so the window is not applied inside it
(:func:`sliding_window`; on N ranks, where every group is packed, a longer row is refused in one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch

from rlkit.backends.local import packed
from rlkit.backends.local.batching import Unit, plan_micro_batches
from rlkit.types import Datum

#: the packed layout runs when its estimated FLOPs are at most this times the two passes' (see above)
PACKED_MARGIN = 1.1

Plan = List[List[Unit]]


@dataclass(frozen=True)
class PassCost:
    """FLOPs of a decoder pass by the two terms the layouts trade (see the module docstring)."""

    linear: float  # per token
    attention: float  # per (query, key) pair
    window: Optional[int] = None  # the model's sliding window: no packed row may be longer

    @classmethod
    def of(cls, layers: Sequence[torch.nn.Module], config: Any) -> "PassCost":
        """From the decoder's layers (their 2-D weights) and its config (heads, head size, window)."""
        matrices = sum(p.numel() for layer in layers for p in layer.parameters() if p.dim() == 2)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(linear=2.0 * matrices, attention=4.0 * heads * head_dim * len(layers), window=sliding_window(config))

    def fits(self, plan: Plan) -> bool:
        """Whether every packed row of ``plan`` is within the sliding window (if the model has one)."""
        return self.window is None or all(packed.packed_len(u) <= self.window for batch in plan for u in batch)

    def rows(self, rows: int, width: int, keys: int = -1) -> float:
        """``rows`` rows of ``width`` query tokens, each reading ``keys`` keys (default ``width``)."""
        keys = width if keys < 0 else keys
        return rows * width * (self.linear + keys * self.attention)

    def packed(self, plan: Plan) -> float:
        return sum(self.rows(len(batch), max(packed.packed_len(u) for u in batch)) for batch in plan)

    def two_pass(self, plan: Plan) -> float:
        total = 0.0
        for batch in plan:
            shared = [u for u in batch if u.prefix_len]
            plain = [n for u in batch if not u.prefix_len for n in u.lengths]
            if shared:
                prompt = max(u.prefix_len for u in shared)
                suffix = max(n - u.prefix_len for u in shared for n in u.lengths)
                members = sum(len(u.indices) for u in shared)
                total += self.rows(len(shared), prompt) + self.rows(members, suffix, prompt + suffix)
            if plain:
                total += self.rows(len(plain), max(plain))
        return total


def sliding_window(config: Any) -> Optional[int]:
    """The model's sliding attention window in tokens, or ``None``. A packed row's block mask is
    the whole attention mask, so the window is not applied inside it: packing is exact only for rows
    no longer than the window (Gemma 2/3 and gpt-oss: 4096 in the real models)."""
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return None
    return int(window)


def choose(cost: PassCost, data: Sequence[Datum], budget: int, min_shared: int) -> Tuple[Plan, bool]:
    """``data``'s micro-batches and whether they run packed: the packed plan (:func:`.packed.plan`)
    when its estimate is within :data:`PACKED_MARGIN` of the two-pass plan's
    (:func:`~.batching.plan_micro_batches`); a batch without shared prompts keeps the two-pass plan
    (nothing to pack)."""
    two = plan_micro_batches(data, budget, min_shared)
    if not any(u.prefix_len for batch in two for u in batch):
        return two, False
    one = packed.plan(data, budget, min_shared)
    if cost.fits(one) and cost.packed(one) <= PACKED_MARGIN * cost.two_pass(two):
        return one, True
    return two, False


def packed_pays(cost: PassCost, data: Sequence[Datum], budget: int, min_shared: int) -> bool:
    """Whether one packed pass suits ``data`` by :func:`choose`'s rule — also true for data without
    shared prompts, whose rows are the same padded rows in either layout (within a sliding window,
    if the model has one: a fused pass gives every row a block mask). A fused pass of several
    runs (:mod:`.fusion`) is packed, so only such data joins one."""
    plan, pack = choose(cost, data, budget, min_shared)
    if pack:
        return True
    return not any(u.prefix_len for batch in plan for u in batch) and cost.fits(packed.plan(data, budget, min_shared))
