"""Decode made for CUDA: static shapes in buckets, each step replayed from a CUDA graph.

On a GPU the lean CPU step (:class:`~.decode.FusedDecode`) is bound by kernel launches — dozens
per layer per token, each a few microseconds of CPU time for a few microseconds of GPU work — and
its shapes change every step (the suffix grows, rows leave), so it cannot be captured. Here:

- **Static buffers.** Each row's keys and values (its prompt's, copied once at prefill, then its
  own tokens) live in ``[rows_bucket, kv_heads, length_bucket, d]`` buffers, with a ``valid``
  mask ``[rows_bucket, length_bucket]`` (left padding and columns not yet written are invalid).
  One step writes column ``col`` for every row and attends over the whole bucket under the mask:
  every tensor's shape and address is fixed for the bucket.
- **Buckets.** Rows round up to a power of two (1, 2, 4, ... ; :func:`bucket_rows`), lengths to
  a power of two of at least :data:`MIN_LENGTH` (:func:`bucket_length`). A batch whose rows drop
  into a smaller bucket moves there, one that fills its length moves to the next; each move copies
  the live rows' caches once. So a bucket's step is captured once and reused by every later batch
  of that shape (:class:`GraphedDecoder` keeps the last :data:`MAX_BUCKETS` buckets).
- **Capture off the hot path.** A bucket runs eagerly (the same static-shape code) for its first
  :data:`CAPTURE_AFTER` steps; only a bucket that keeps being used is captured
  (``torch.cuda.CUDAGraph``, after two warm-up runs on a side stream, state restored after them)
  and then replayed. A capture that fails (an operation that cannot be captured, a rotary variant
  that reads a value back to the host) is logged once and the bucket stays eager. ``RLKIT_CUDA_GRAPHS=0``
  keeps every bucket eager.

The sampler uses this only where ``device.type == "cuda"`` and the lean decode applies, for a
batch of *one* set of weights (merged; no joins into a running batch here: requests that arrive
meanwhile wait for the next batch). A batch that starts with several LoRA adapters (per-row,
unmerged: :mod:`.row_lora`) runs :class:`~.decode.FusedDecode` on the GPU instead — eager, no
graphs, but with continuous admission of further adapters' requests; the CPU path is
:class:`~.decode.FusedDecode`, unchanged. The static step is plain PyTorch, so its results are
tested on the CPU against the model's own forward (``tests/backends/test_local_cuda_decode.py``);
the capture itself needs a GPU (``benchmarks/gpu_check.sh``).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from rlkit.backends.local.decode import FusedWeights, _prefill, _signed_sin, step_qkv, step_rest

log = logging.getLogger(__name__)
MIN_LENGTH = 128
CAPTURE_AFTER = 8
MAX_BUCKETS = 6


def bucket_rows(n: int) -> int:
    """The row bucket for ``n`` live rows: the smallest power of two >= ``n``."""
    return 1 << max(int(n) - 1, 0).bit_length()


def bucket_length(n: int) -> int:
    """The length bucket for ``n`` cache columns: the smallest power of two >= ``max(n, MIN_LENGTH)``."""
    return bucket_rows(max(int(n), MIN_LENGTH))


def _is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def graphs_enabled() -> bool:
    return os.environ.get("RLKIT_CUDA_GRAPHS", "1").lower() not in ("0", "false", "no", "off")


class _Bucket:
    """Static tensors of one ``(rows, length)`` bucket, and its captured step once there is one."""

    def __init__(self, f: FusedWeights, rows: int, length: int, device: torch.device, dtype: torch.dtype):
        self.rows, self.length = rows, length
        kv = (rows, f.kv_heads, length, f.head_dim)
        self.keys = [torch.zeros(kv, device=device, dtype=dtype) for _ in f.layers]
        self.values = [torch.zeros(kv, device=device, dtype=dtype) for _ in f.layers]
        self.valid = torch.zeros((rows, length), dtype=torch.bool, device=device)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.col = torch.zeros(1, dtype=torch.long, device=device)
        self.out: Optional[torch.Tensor] = None
        self.graph = None
        self.steps = 0
        self.failed = False

    def reset(self) -> None:
        self.valid.zero_()


class GraphedDecoder:
    """The bucket cache of one sampler (one model): :meth:`start` begins a decode."""

    def __init__(self, fused: FusedWeights, *, use_graphs: Optional[bool] = None):
        self.f = fused
        self.use_graphs = graphs_enabled() if use_graphs is None else use_graphs
        self.buckets: "OrderedDict[Tuple[int, int], _Bucket]" = OrderedDict()
        self.captures = 0
        self.dtype = fused.lm_head.weight.dtype

    def bucket(self, rows: int, length: int, device: torch.device, keep: Optional[_Bucket] = None) -> _Bucket:
        key = (bucket_rows(rows), bucket_length(length))
        entry = self.buckets.pop(key, None) or _Bucket(self.f, key[0], key[1], device, self.dtype)
        self.buckets[key] = entry  # most recent last
        while len(self.buckets) > MAX_BUCKETS:
            old = next(iter(self.buckets))
            if self.buckets[old] is entry or self.buckets[old] is keep:
                break
            del self.buckets[old]
        entry.reset()
        return entry

    def start(self, ids, mask, positions, row_prompt: torch.Tensor) -> "StaticDecode":
        return StaticDecode(self, ids, mask, positions, row_prompt)

    # -- one step over a bucket's static tensors ---------------------------------------------------
    def compute(self, b: _Bucket) -> None:
        f = self.f
        x = f.decoder.embed_tokens(b.tokens)  # [Rb, hidden]
        cos, sin = f.decoder.rotary_emb(x[:, None], b.pos[:, None])
        sin = _signed_sin(sin)
        rows = b.rows
        b.valid.index_fill_(1, b.col, True)
        mask = b.valid[:, None, None, :]
        for i, layer in enumerate(f.layers):
            q, k, v = step_qkv(f, layer, x, cos, sin)
            b.keys[i].index_copy_(2, b.col, k.unsqueeze(2).to(self.dtype))
            b.values[i].index_copy_(2, b.col, v.unsqueeze(2).to(self.dtype))
            attn = F.scaled_dot_product_attention(q.unsqueeze(2).to(self.dtype), b.keys[i], b.values[i], attn_mask=mask,
                                                  scale=f.scale, enable_gqa=True)
            x = step_rest(f, layer, x, attn.reshape(rows, f.heads * f.head_dim).to(x.dtype))
        logits = f.linear(f.decoder.norm(x), f.lm_head.weight, f.lm_head.bias).float()
        if b.out is None:
            b.out = logits
        else:
            b.out.copy_(logits)
        b.pos.add_(1)
        b.col.add_(1)

    def run(self, b: _Bucket) -> None:
        if b.graph is not None:
            b.graph.replay()
            return
        b.steps += 1
        if self.use_graphs and not b.failed and b.steps > CAPTURE_AFTER and _is_cuda(b.tokens) and b.out is not None:
            try:
                self._capture(b)
                b.graph.replay()  # type: ignore[union-attr]
                return
            except Exception as exc:  # noqa: BLE001 - any capture failure: this bucket stays eager
                b.failed, b.graph = True, None
                log.warning("CUDA graph capture of decode bucket %dx%d failed (%s); it runs eagerly", b.rows, b.length, exc)
        self.compute(b)

    def _capture(self, b: _Bucket) -> None:
        """Warm up twice on a side stream, capture one step, restore the state the warm-ups advanced
        (positions, write column, mask; the keys/values they wrote at ``col`` are rewritten by the
        real step). The captured graph is then replayed for this step and every later one."""
        saved = (b.pos.clone(), b.col.clone(), b.valid.clone())

        def restore() -> None:
            b.pos.copy_(saved[0]), b.col.copy_(saved[1]), b.valid.copy_(saved[2])

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.compute(b)
                restore()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.compute(b)
        restore()
        b.graph = graph
        self.captures += 1


class StaticDecode:
    """Decode state over one bucket at a time (same interface as :class:`~.decode.FusedDecode`,
    without :meth:`join`): rows ``0 .. n-1`` of the bucket are the live rows, in order."""

    can_join = False

    def __init__(self, g: GraphedDecoder, ids, mask, positions, row_prompt: torch.Tensor):
        from transformers import DynamicCache

        self.g = g
        f = g.f
        cache = DynamicCache()
        last = _prefill(f.decoder, f.lm_head, ids, mask, positions, cache)
        width, n = ids.shape[1], row_prompt.shape[0]
        self.n = n
        self.b = g.bucket(n, width + 1, ids.device)
        b = self.b
        for i, layer in enumerate(cache.layers):
            b.keys[i][:n, :, :width] = layer.keys[row_prompt].to(g.dtype)
            b.values[i][:n, :, :width] = layer.values[row_prompt].to(g.dtype)
        b.valid[:n, :width] = mask[row_prompt].bool()
        b.pos[:n] = positions[row_prompt, -1] + 1
        b.col.fill_(width)
        self.col = width  # host copy of b.col
        self.first_logits = last[row_prompt]

    @property
    def rows(self) -> int:
        return self.n

    def _move(self, rows: int, length: int, index: Optional[torch.Tensor] = None) -> None:
        """Carry the live rows (``index``, default all) into the bucket for ``rows`` x ``length``."""
        old = self.b
        new = self.g.bucket(rows, length, old.tokens.device, keep=old)
        pick = index if index is not None else torch.arange(self.n, device=old.tokens.device)
        width = min(old.length, new.length)
        for src, dst in zip(old.keys + old.values, new.keys + new.values):
            dst[:rows, :, :width] = src[pick, :, :width]
        new.valid[:rows, :width] = old.valid[pick, :width]
        new.pos[:rows] = old.pos[pick]
        new.col.copy_(old.col)
        self.b, self.n = new, rows

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the rows ``index`` (in that order)."""
        rows = int(index.shape[0])
        if rows == 0:
            self.n = 0
            return
        if bucket_rows(rows) < self.b.rows:
            self._move(rows, self.b.length, index)
            return
        b = self.b
        for buf in b.keys + b.values:
            buf[:rows] = buf[index]
        b.valid[:rows] = b.valid[index]
        b.pos[:rows] = b.pos[index]
        self.n = rows

    def step(self, tokens: torch.Tensor, lora: Optional[object] = None) -> torch.Tensor:
        """One token a row. Per-row LoRA is refused here (the sampler decodes a batch of several
        adapters with :class:`~.decode.FusedDecode` instead, on the GPU too)."""
        if lora is not None:
            raise ValueError("the CUDA-graph decode has no per-row LoRA: decode a batch of several adapters with FusedDecode")
        if self.col >= self.b.length:  # the length bucket is full: the next one
            self._move(self.n, self.col + 1)
        b = self.b
        b.tokens[: self.n] = tokens
        self.g.run(b)
        self.col += 1
        return b.out[: self.n].clone()  # type: ignore[index]


def buckets_in_use(g: GraphedDecoder) -> List[Tuple[int, int]]:
    """The ``(rows, length)`` buckets ``g`` holds, oldest first (for tests and benchmarks)."""
    return list(g.buckets)
