"""Unmerged, per-row LoRA: many runs' rows in one forward and backward over one frozen base.

Every adapted linear layer of a :class:`MultiLoraModel` computes, for a batch whose row ``i``
carries adapter ``adapter_ids[i]`` (``None``: the base model),

    y = x W^T + b                                  (all rows, one product)
    y[rows of k] += scale_k * (x[rows of k] A_k^T) B_k^T   (each adapter k, its own rows only)

with ``scale_k = alpha_k / rank_k``: the base product once for the whole batch and each adapter's
low-rank pair of matmuls only over its own rows. Rows are grouped by adapter (:class:`Routing`):
a run whose rows are contiguous (the layout :func:`fused_run` builds) uses a slice of the batch,
otherwise its rows are gathered (``index_select``) and scattered back (``index_add``). Plain
torch, the same code on CPU and CUDA, no custom kernel.

Adapters are *live* tensors owned by their runs — normally each run's
:class:`~.engine.TrainingEngine` (:meth:`MultiLoraModel.attach` takes its
:meth:`~.engine.TrainingEngine.lora_modules`), so each run keeps its own rank, alpha, optimizer,
schedule, gradient accumulation and checkpoints; the model holds only references. The backward of
a fused pass sends each adapter its own gradient: rows never mix in a causal LM's forward
(attention stays within a row), so adapter ``k``'s parameters touch only run ``k``'s rows, and
``d(sum_j loss_j)/d(theta_k) = d(loss_k)/d(theta_k)``. The gradients land in each engine's own
``.grad`` and accumulate there exactly as the engine's own ``forward_backward`` would leave them.

Equality with one adapter at a time (PEFT's ``y = x W^T + b + scale * B(A(x))``, the engine's own
path) is the arithmetic of the rows themselves, up to the floating-point rounding of matmuls over
a different batch shape: in fp32 per-token logprobs agree within 1e-5 and gradients within a
relative 1e-4 (``tests/backends/test_local_multi_lora.py``).

Not thread-safe: one pass at a time (the routing of the running pass is the model's state until
its backward has finished). Built: the right-padded forward (:meth:`MultiLoraModel.token_logprobs`)
and the packed one (:meth:`MultiLoraModel.packed_logprobs`, :mod:`.packed`: a GRPO group's prompt
and its members' completions in one row, the prompt computed once), which :func:`fused_run` uses for
``forward`` and ``forward_backward``. Measured (``benchmarks/many_runs.py --core --core-group 4``,
SmolLM2, 2 CPU cores, groups of 4 on a 40-token prompt): one packed fused pass of 1, 2 or 4 runs was
1.13-1.14x the throughput of each run's own two-pass shared-prompt layout — the packing's gain, not
the fusion's: a run's own engine now packs such groups too (:mod:`.layout`), and then N runs' fused
pass costs about N times one run's on a CPU that is compute-bound at this size; logprobs within
1.7e-5 of the two-pass layout on SmolLM2's 30 layers. The sampler's side (prefill, both decode paths, prompt scoring with
several adapters in one batch) is :mod:`.row_lora`; the scheduler that gathers different runs'
passes is :mod:`.fusion`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from rlkit.backends.local import activations, packed
from rlkit.backends.local.batching import right_padded
from rlkit.backends.local.device import autocast
from rlkit.backends.local.batching import Unit, make_units, merge_metrics
from rlkit.backends.local.engine import LLAMA_ATTN, LLAMA_MLP, TrainingEngine
from rlkit.backends.local.families import target_logprobs_for
from rlkit.backends.local.models import share_base
from rlkit.backends.local.pieces import Pieces
from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss
from rlkit.types import Datum, ForwardBackwardOutput, TensorData, TokenUsage

#: ``{module path in the causal LM: (A [rank, in], B [out, rank], scale = alpha / rank)}``, the
#: shape of :meth:`TrainingEngine.lora_modules` and of the sampler's adapters
Adapter = Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]


@dataclass(frozen=True)
class Segment:
    """The rows of one adapter in a batch: ``rows[start:stop]`` when contiguous (``index`` None),
    else the rows listed in ``index`` (a long tensor on the model's device)."""

    key: str
    start: int
    stop: int
    index: Optional[torch.Tensor] = None


class Routing:
    """Which rows of the running batch use which adapter: one :class:`Segment` per adapter, in order
    of first appearance; rows whose id is ``None`` get the base model only."""

    def __init__(self, adapter_ids: Sequence[Optional[str]], device: torch.device):
        self.rows = len(adapter_ids)
        rows_of: Dict[str, List[int]] = {}
        for i, key in enumerate(adapter_ids):
            if key is not None:
                rows_of.setdefault(key, []).append(i)
        self.segments: List[Segment] = []
        for key, rows in rows_of.items():
            if rows[-1] - rows[0] + 1 == len(rows):
                self.segments.append(Segment(key, rows[0], rows[-1] + 1))
            else:
                self.segments.append(Segment(key, rows[0], rows[-1] + 1, torch.tensor(rows, device=device)))


class MultiLoraLinear(torch.nn.Module):
    """A frozen base ``nn.Linear`` plus per-row low-rank updates (see the module docstring). The
    adapters' tensors are not parameters of this module: they belong to their runs."""

    def __init__(self, base: torch.nn.Linear, path: str, owner: "MultiLoraModel"):
        super().__init__()
        self.base = base
        self.path = path
        self.adapters: Dict[str, Tuple[torch.Tensor, torch.Tensor, float]] = {}
        self._owner = [owner]  # in a list: not registered as a submodule

    @property
    def weight(self) -> torch.Tensor:  # the base's, for code that reads ``module.weight``
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        routing = self._owner[0].routing
        if routing is None or not self.adapters:
            return out
        if x.dim() < 2 or x.shape[0] != routing.rows:
            raise InvalidInputError(
                f"per-row LoRA at {self.path}: the input's first dimension {tuple(x.shape)[:1]} is not the batch's "
                f"{routing.rows} rows (a layer that flattens rows, e.g. a mixture-of-experts expert, cannot be routed)"
            )
        # Out of place: an in-place add into a slice of ``out`` makes autograd copy and zero-fill the
        # whole output per adapter in backward (CopySlices/AsStrided: ~55% of a 4-run pass's CPU time
        # under torch.profiler; wall clock, best of 4: 4.54 s -> 4.24 s on SmolLM2, 2 cores). The
        # contiguous segments' products are concatenated (zeros between them) and added once.
        slices: List[Tuple[int, int, torch.Tensor]] = []
        for seg in routing.segments:
            lora = self.adapters.get(seg.key)
            if lora is None:  # this adapter does not adapt this layer (e.g. attention-only)
                continue
            a, b, scale = lora
            if seg.index is None:
                slices.append((seg.start, seg.stop, F.linear(F.linear(x[seg.start : seg.stop], a), b) * scale))
            else:
                out = out.index_add(0, seg.index, F.linear(F.linear(x.index_select(0, seg.index), a), b) * scale)
        if slices:
            out = out + _rows(slices, out)
        return out


def _rows(slices: List[Tuple[int, int, torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like ``like`` holding each ``(start, stop, value)`` at rows ``start:stop``
    and zeros elsewhere (one ``cat``: its backward hands each value its slice of the gradient)."""
    parts, cursor = [], 0
    for start, stop, value in sorted(slices, key=lambda s: s[0]):
        if start > cursor:
            parts.append(like.new_zeros((start - cursor, *like.shape[1:])))
        parts.append(value)
        cursor = stop
    if cursor < like.shape[0]:
        parts.append(like.new_zeros((like.shape[0] - cursor, *like.shape[1:])))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _targets(model: torch.nn.Module) -> List[str]:
    """Paths of the linear layers an adapter may adapt: the attention and MLP projections."""
    names = set(LLAMA_ATTN + LLAMA_MLP)
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in names]


class MultiLoraModel:
    """One frozen base (a module tree over ``base_model``'s tensors, no copy) whose attention and
    MLP projections are :class:`MultiLoraLinear`; adapters are added by key, and a pass routes each
    row to its adapter (:meth:`routed`)."""

    def __init__(self, base_model: torch.nn.Module, *, precision: str = "fp32", device: Optional[torch.device] = None,
                 activation_checkpointing: activations.Mode = False):
        if precision not in ("fp32", "bf16"):
            raise InvalidInputError(f"precision={precision!r}: expected 'fp32' or 'bf16'")
        self.precision = precision
        self.model = share_base(base_model)
        self.device = torch.device(device) if device is not None else next(self.model.parameters()).device
        self.routing: Optional[Routing] = None
        self.adapters: Dict[str, Adapter] = {}
        self.engines: Dict[str, TrainingEngine] = {}
        self.layers: Dict[str, MultiLoraLinear] = {}
        for path in _targets(self.model):
            parent, _, name = path.rpartition(".")
            wrapped = MultiLoraLinear(self.model.get_submodule(path), path, self)
            setattr(self.model.get_submodule(parent) if parent else self.model, name, wrapped)
            self.layers[path] = wrapped
        self.model.train()  # no dropout in these models; lets activation checkpointing run in backward passes
        self.decoder = self.model.get_decoder()
        self.lm_head = self.model.get_output_embeddings()
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.logprobs_fn = target_logprobs_for(self.model.config)
        self.compute_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.activation_checkpointing = activations.check_mode(activation_checkpointing)
        layers = getattr(self.decoder, "layers", None)
        self.n_layers = len(layers) if isinstance(layers, torch.nn.ModuleList) else 0
        if self.n_layers:
            activations.install(layers)

    # -- adapters -----------------------------------------------------------------------------------
    def add_adapter(self, key: str, adapter: Adapter) -> None:
        """Route rows tagged ``key`` through ``adapter`` (live tensors: their gradients go to them)."""
        if key in self.adapters:
            raise InvalidInputError(f"adapter {key!r} is already added; remove it first")
        unknown = sorted(set(adapter) - set(self.layers))
        if unknown:
            raise InvalidInputError(f"adapter {key!r}: no adaptable linear layer at {unknown[:3]} (adaptable: {sorted(self.layers)[:3]} ...)")
        for path, (a, b, scale) in adapter.items():
            base = self.layers[path].base
            if a.dim() != 2 or b.dim() != 2 or a.shape[1] != base.in_features or b.shape[0] != base.out_features or a.shape[0] != b.shape[1]:
                raise InvalidInputError(f"adapter {key!r} at {path}: A {tuple(a.shape)} / B {tuple(b.shape)} do not fit "
                                        f"a {base.in_features} -> {base.out_features} layer")
            if not math.isfinite(float(scale)):
                raise InvalidInputError(f"adapter {key!r} at {path}: scale {scale} is not finite")
        for path, (a, b, scale) in adapter.items():
            self.layers[path].adapters[key] = (a, b, float(scale))
        self.adapters[key] = adapter

    def attach(self, key: str, engine: TrainingEngine) -> None:
        """Add ``engine``'s live adapter under ``key``; a fused backward then counts its tokens in
        ``engine.pending_grad_tokens`` as the engine's own ``forward_backward`` does."""
        self.add_adapter(key, engine.lora_modules())
        self.engines[key] = engine

    def remove_adapter(self, key: str) -> None:
        """Forget ``key`` (its tensors are untouched)."""
        for layer in self.layers.values():
            layer.adapters.pop(key, None)
        self.adapters.pop(key, None)
        self.engines.pop(key, None)

    @contextlib.contextmanager
    def routed(self, adapter_ids: Sequence[Optional[str]]) -> Iterator[None]:
        """Within this block, batch row ``i`` uses adapter ``adapter_ids[i]`` (``None``: base). A
        backward pass through a checkpointed layer recomputes it, so run it inside the block too."""
        unknown = sorted({k for k in adapter_ids if k is not None and k not in self.adapters})
        if unknown:
            raise InvalidInputError(f"adapter ids {unknown[:3]} are not added (added: {sorted(self.adapters)[:5]})")
        previous, self.routing = self.routing, Routing(adapter_ids, self.device)
        try:
            yield
        finally:
            self.routing = previous

    # -- forward ------------------------------------------------------------------------------------
    def hidden(self, tokens: List[List[int]], adapter_ids: Sequence[Optional[str]], checkpoint_layers: int = 0) -> List[torch.Tensor]:
        """The decoder's last hidden states of each token list, row ``i`` through adapter
        ``adapter_ids[i]``, as one right-padded batch (the caller sets grad mode and autocast)."""
        if len(tokens) != len(adapter_ids):
            raise InvalidInputError(f"{len(tokens)} rows but {len(adapter_ids)} adapter ids")
        input_ids, mask = right_padded(tokens, self.pad_id)
        with self.routed(adapter_ids), activations.checkpointing(checkpoint_layers, keep_cache=False):
            out = self.decoder(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False).last_hidden_state
        return [out[i, : len(t)] for i, t in enumerate(tokens)]

    def token_logprobs(self, data: Sequence[Datum], adapter_ids: Sequence[Optional[str]], checkpoint_layers: int = 0) -> List[torch.Tensor]:
        """Per-datum logprobs of ``target_tokens`` (``log softmax(logits_t / T_t)[target_t]``, the
        engine's rule), datum ``i`` through adapter ``adapter_ids[i]``; keeps the autograd graph
        when grad is enabled. Returned on the CPU, where the datums' loss inputs live."""
        pieces = Pieces(data)
        with autocast(self.device, self.precision):
            hiddens = self.hidden([d.model_input.to_ints() for d in data], adapter_ids, checkpoint_layers)
            for i, hidden in enumerate(hiddens):
                pieces.plain(i, hidden)
        return pieces.logprobs(self.logprobs_fn, self.lm_head, self.device, self.compute_dtype)

    def packed_logprobs(self, data: Sequence[Datum], units: Sequence[Unit], adapter_ids: Sequence[Optional[str]],
                        checkpoint_layers: int = 0) -> List[torch.Tensor]:
        """:meth:`token_logprobs` with ``data`` laid out as packed rows (:mod:`.packed`): unit ``u``
        (a shared prompt and its members' completions, the prompt once; or one datum) is one row,
        through adapter ``adapter_ids[u]``."""
        if len(units) != len(adapter_ids):
            raise InvalidInputError(f"{len(units)} packed rows but {len(adapter_ids)} adapter ids")
        rows = [(u.prefix_len, [data[i].model_input.to_ints() for i in u.indices]) for u in units]
        ids, positions, mask, spans = packed.packed_inputs(rows, self.pad_id)
        pieces = Pieces(data)
        dev = self.device
        with autocast(dev, self.precision):
            with self.routed(adapter_ids), activations.checkpointing(checkpoint_layers, keep_cache=False):
                out = self.decoder(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                                   use_cache=False).last_hidden_state
            for r, (unit, row) in enumerate(zip(units, spans)):
                pieces.unit(unit, [out[r, a:b] for a, b in row])
        return pieces.logprobs(self.logprobs_fn, self.lm_head, dev, self.compute_dtype)

    def checkpoint_layers(self, tokens: int) -> int:
        """Decoder layers to checkpoint for ``tokens`` padded tokens of the fused runs' rows (the
        engine's rule, :mod:`.activations`: the memory there is, one budget for the process)."""
        return activations.layers_for(self.activation_checkpointing, tokens, self.n_layers, self.model.config, self.device,
                                      self.model)


# -- many runs' operations in one pass ---------------------------------------------------------------


@dataclass
class RunWork:
    """One run's share of a fused pass: its datums and its loss, under adapter ``key``; datums
    sharing at least ``min_shared_prefix`` leading tokens run their prompt once (its engine's rule)."""

    key: str
    data: Sequence[Datum]
    loss: Loss
    min_shared_prefix: int = 16


def plan_units(works: Sequence[RunWork], micro_batch_tokens: int) -> List[List[Tuple[int, Unit]]]:
    """Micro-batches of ``(work, unit)`` pairs: each run's datums grouped into units as its engine
    groups them (a shared prompt and its members; :func:`~.batching.make_units`), each unit one
    packed row (split into parts of whole members when over the budget, :func:`.packed.split`),
    rows packed into micro-batches of ``rows x longest row <= micro_batch_tokens``
    (:func:`.packed.fill`), each run's rows contiguous within a micro-batch. A loss that is not
    ``datum_separable`` needs all its datums at once: then one micro-batch holds everything."""
    items = [(w, part) for w, work in enumerate(works) for unit in make_units(work.data, work.min_shared_prefix)
             for part in packed.split(unit, micro_batch_tokens)]
    if not all(work.loss.datum_separable for work in works):
        return [items] if items else []
    return [sorted(batch, key=lambda item: item[0]) for batch in packed.fill(items, lambda item: packed.packed_len(item[1]), micro_batch_tokens)]


def fused_run(model: MultiLoraModel, works: Sequence[RunWork], *, backward: bool,
              micro_batch_tokens: int = 2048) -> List[Union[ForwardBackwardOutput, Exception]]:
    """``forward`` (``backward=False``) or ``forward_backward`` of several runs in shared passes:
    each micro-batch (:func:`plan_units`) is one decoder pass in which every row goes through the
    base once and its run's adapter; a GRPO group's prompt is computed once, as in its engine's own
    pass. Each run's loss sees only its own datums (and, with ``backward``, its adapter gets only
    its gradient, accumulated into its tensors' ``.grad``).

    Returns, per work in order, what the engine's own ``run`` returns for it alone (logprobs per
    datum, merged metrics, ``tokens:train``), or the exception its loss raised: a run whose loss
    fails (bad inputs, a non-finite value) gets its error and contributes nothing from that
    micro-batch on; the other runs go on. An error of the pass itself (out of memory) is raised."""
    for work in works:
        if work.key not in model.adapters:
            raise InvalidInputError(f"run {work.key!r}: its adapter is not added to the model")
    logprobs: List[List[Optional[torch.Tensor]]] = [[None] * len(work.data) for work in works]
    metrics: List[Dict[str, float]] = [{} for _ in works]
    weights: List[Dict[str, float]] = [{} for _ in works]
    failed: Dict[int, Exception] = {}
    for batch in plan_units(works, micro_batch_tokens):
        batch = [(w, unit) for w, unit in batch if w not in failed]
        if not batch:
            continue
        chunk: List[Datum] = []
        owner: List[Tuple[int, int]] = []  # chunk position -> (work, datum index in that work)
        units: List[Unit] = []
        for w, unit in batch:
            start = len(chunk)
            chunk += [works[w].data[i] for i in unit.indices]
            owner += [(w, i) for i in unit.indices]
            units.append(Unit(list(range(start, len(chunk))), unit.prefix_len, unit.lengths))
        ids = [works[w].key for w, _ in batch]
        layers = model.checkpoint_layers(len(units) * max(packed.packed_len(u) for u in units)) if backward else 0
        with model.routed(ids), torch.set_grad_enabled(backward):
            lps = model.packed_logprobs(chunk, units, ids, layers)
            total: Optional[torch.Tensor] = None
            for w in dict.fromkeys(w for w, _ in batch):
                mine = [k for k, (v, _) in enumerate(owner) if v == w]
                try:
                    value, part = works[w].loss([chunk[k] for k in mine], [lps[k] for k in mine])
                    if backward and not torch.isfinite(value):
                        raise InvalidInputError(f"{works[w].loss.name}: the loss is {float(value.detach())} (not finite); "
                                                "this micro-batch's gradients were not applied")
                except Exception as exc:  # noqa: BLE001 - the run's own failure, reported as its result
                    failed[w] = exc
                    continue
                merge_metrics(metrics[w], part, weights[w])
                for k in mine:
                    logprobs[w][owner[k][1]] = lps[k]
                total = value if total is None else total + value
            if backward and total is not None:
                total.backward()
    results: List[Union[ForwardBackwardOutput, Exception]] = []
    for w, work in enumerate(works):
        if w in failed:
            results.append(failed[w])
            continue
        n_tokens = sum(d.model_input.length for d in work.data)
        engine = model.engines.get(work.key)
        if backward and engine is not None:
            engine.pending_grad_tokens += n_tokens
        metrics[w]["tokens:train"] = float(n_tokens)
        results.append(ForwardBackwardOutput(
            loss_fn_outputs=[{"logprobs": TensorData.from_torch(lp.detach())} for lp in logprobs[w]],  # type: ignore[union-attr]
            metrics=metrics[w],
            usage=TokenUsage(train_tokens=n_tokens),
        ))
    return results

