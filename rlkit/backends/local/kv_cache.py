"""A key/value cache for decoding that grows in place.

``transformers``' ``DynamicCache`` concatenates every new token's keys and values onto the whole
cache, so each decode step copies all of it (per layer). :class:`GrowingCache` keeps a buffer with
spare capacity (doubling when full), writes new entries in place and hands attention a view of the
filled part: one copy per doubling instead of one per token. For inference only (in-place writes).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0

    def _expose(self) -> None:
        self.keys = self._k[:, :, : self._n]
        self.values = self._v[:, :, : self._n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self._n, key_states.shape[-2]
        if self._k is None or n + add > self._k.shape[-2]:
            cap = max(2 * (n + add), 64)
            b, h, _, d = key_states.shape
            k = key_states.new_empty(b, h, cap, d)
            v = value_states.new_empty(b, h, cap, value_states.shape[-1])
            if n:
                k[:, :, :n] = self._k[:, :, :n]
                v[:, :, :n] = self._v[:, :, :n]
            self._k, self._v = k, v
        self._k[:, :, n : n + add] = key_states
        self._v[:, :, n : n + add] = value_states
        self._n = n + add
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self._n:
            self._k, self._v = self._k[indices], self._v[indices]
            self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized and self._n:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._expose()


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` whose layers grow in place (see module docstring)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
