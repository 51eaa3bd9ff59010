"""A micro-batch's hidden states, datum by datum in pieces, through the output layer in one call.

Every layout of the engine's decoder passes — right-padded rows, a shared prompt then its members'
suffixes against its cache (:mod:`.batching`), a prompt and its members packed in one row
(:mod:`.packed`), with one adapter or many (:mod:`.multi_lora`) — ends the same way: each datum's
hidden states are a few pieces (its whole row; or the shared prompt's positions, the prompt's last
position, its own suffix), and each piece's targets and temperatures are the datum's at those
positions. :class:`Pieces` collects them, runs the output layer once over all of them
(``logprob[t] = log softmax(logits_t / T_t)[target_t]``, :func:`~.logprobs.target_logprobs`, which
never holds the whole ``[N, V]`` logits) and gives each datum its logprobs back in order.

A shared prompt's positions ``0 .. P-2`` are one piece for all its members (the same targets and
temperatures: :func:`~.batching.make_units` checked), so its output layer runs once; position
``P-1`` is each member's own (its target is the member's first completion token).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from rlkit.backends.local.batching import Unit
from rlkit.losses.base import datum_input
from rlkit.types import Datum


class Pieces:
    """Hidden-state pieces of ``data``'s datums (see the module docstring)."""

    def __init__(self, data: Sequence[Datum]):
        self.rows: List[torch.Tensor] = []
        self.targets: List[torch.Tensor] = []
        self.temperatures: List[torch.Tensor] = []
        self.layout: List[List[int]] = [[] for _ in data]  # datum -> its pieces, in order
        self._target_of = [datum_input(d, "target_tokens", dtype=torch.long) for d in data]
        self._temperature_of = [datum_input(d, "temperature") if "temperature" in d.loss_fn_inputs else None for d in data]

    def _piece(self, hidden: torch.Tensor, i: int, start: int) -> int:
        """Queue ``hidden`` (datum ``i``'s positions ``start ..``); its piece number."""
        n = hidden.shape[0]
        self.rows.append(hidden)
        self.targets.append(self._target_of[i][start : start + n])
        temps = self._temperature_of[i]
        self.temperatures.append(temps[start : start + n] if temps is not None else torch.ones(n))  # CPU: moved once
        return len(self.rows) - 1

    def plain(self, i: int, hidden: torch.Tensor) -> None:
        """Datum ``i``'s whole row of hidden states."""
        self.layout[i].append(self._piece(hidden, i, 0))

    def shared(self, unit: Unit, prefix: torch.Tensor, suffixes: Sequence[torch.Tensor]) -> None:
        """A shared-prompt unit: the prompt's hidden states once, then each member's suffix."""
        shared = self._piece(prefix[:-1], unit.indices[0], 0)
        for i, suffix in zip(unit.indices, suffixes):
            self.layout[i] += [shared, self._piece(prefix[-1:], i, unit.prefix_len - 1), self._piece(suffix, i, unit.prefix_len)]

    def unit(self, unit: Unit, segments: Sequence[torch.Tensor]) -> None:
        """A packed row's segments (:func:`~.packed.packed_inputs`): a plain unit's one datum, or a
        shared unit's prompt then each member's suffix."""
        if unit.prefix_len:
            self.shared(unit, segments[0], segments[1:])
        else:
            self.plain(unit.indices[0], segments[0])

    def logprobs(self, logprobs_fn: Callable[..., torch.Tensor], lm_head: torch.nn.Module, device: torch.device,
                 compute_dtype: Optional[torch.dtype]) -> List[torch.Tensor]:
        """Per-datum logprobs of its targets, on the CPU (where a loss's inputs live); differentiable."""
        logprobs = logprobs_fn(
            torch.cat(self.rows), lm_head.weight, torch.cat(self.targets).to(device), torch.cat(self.temperatures).to(device),
            bias=lm_head.bias, compute_dtype=compute_dtype,
        ).cpu()
        parts = torch.split(logprobs, [r.shape[0] for r in self.rows])
        return [torch.cat([parts[k] for k in ks]) if len(ks) > 1 else parts[ks[0]] for ks in self.layout]
