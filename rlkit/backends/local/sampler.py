"""Batched KV-cache decoding for the local backend.

The sampler owns its own copy of the model (in the sampling precision), so it never shares
mutable state with the trainer: a sampling client bound to a checkpoint keeps seeing that
checkpoint. A request carries its weights (:meth:`SampleRequest.for_weights`: a key and a LoRA
adapter, full fine-tuning weights, or the base model), and a batch runs in one of two modes:

- **merged**, a batch of one set of weights: the adapter is merged into the sampling copy
  (``W = W_base + scale * B @ A``; full fine-tuning weights replace the parameters). This is the
  mode of a batch that starts with one key: measured on the tiny model and SmolLM2 it is the
  faster one for a single adapter (no low-rank products per step; ``benchmarks/many_runs.py --sampling``)
  — unless the last decode mixed several adapters: then other runs' requests are likely to join
  this one too, and a merge (0.17 s for SmolLM2 on 2 CPU cores) that the first join undoes would
  be wasted, so the batch starts per-row (measured with 4 tinker clients: every step's decode
  merged its first client's weights, then turned per-row when the others joined);
- **per-row** (unmerged), a batch of several LoRA adapters and/or the base model on one base: the
  weights stay the base's and each row adds its own adapter's low-rank product in every adapted
  layer (:mod:`.row_lora`), in the prefill, every decode step and prompt scoring, so different
  runs' samples share one decode. A merged batch that admits a request for other LoRA weights
  switches to per-row between two steps (the running rows' caches stay valid: same weights, other
  arithmetic). Full fine-tuning weights always decode alone. A request's tokens and logprobs are
  those it gets alone up to float rounding: greedy tokens identical, logprobs within 1e-4 in fp32
  (``tests/backends/test_local_fused_sampling.py``; a greedy near-tie, two logits within that
  rounding, could in principle pick the other token).

Requests arriving together are decoded together. Each distinct prompt is prefilled once and its
KV cache is shared by its ``num_samples`` rows (the GRPO fast path): Llama-family models decode
with :class:`~.decode.FusedDecode`, which keeps the prompt's cache once and attends to it once per
prompt per step; other models with their own forward, each row holding a copy (:mod:`.decode`).
Each step samples every live row with its request's parameters, from its request's own
``torch.Generator`` (same seed, same output), and finished rows are dropped from the batch.

Sampled ``logprobs`` are log-probabilities under the temperature-scaled distribution
``softmax(logits / T)`` (T = 1 for greedy, ``temperature=0``). ``top_p`` / ``top_k`` truncate what
is sampled from but are not folded into the reported logprob, so a trainer that scores with the
same temperature reproduces it exactly.

A request whose ``params.constraint`` is set (:mod:`rlkit.constraints`) has, per sample row, a
grammar matcher: at each step, in either decode loop, the tokens its grammar forbids are masked
out of what is sampled (greedy included) before ``top_k`` / ``top_p``, the chosen token advances
the matcher, and the sample ends when the grammar is complete. The reported logprob is the
unmasked one (the mask is a truncation, like ``top_p``).

A request may carry an ``on_token`` listener (what ``rlkit serve`` streams from): it hears each
token the moment it is chosen, before the batch finishes. A request the caller gave up on
(``cancelled(request)`` true) loses its rows at the next decode step, so the rest of the batch —
and the next batch — no longer pay for it.

Temperatures below :data:`rlkit.types.GREEDY_TEMPERATURE` (1e-6) are greedy, like ``0``: dividing
float32 logits by ``1e-45`` makes them ±inf and the softmax NaN, while the limit of
``softmax(logits / T)`` as T -> 0 is the argmax; the reported logprob is then the greedy one (T = 1).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from rlkit.backends.local.batching import prefill_parts
from rlkit.backends.local.decode import FusedWeights, fused_unsupported_reason, start_decode
from rlkit.backends.local.device import generator as make_generator
from rlkit.backends.local.engine import FullWeights
from rlkit.backends.local.families import logit_softcap, output_logits
from rlkit.backends.local.models import share_base, shares_storage
from rlkit.backends.local.precision import fp32_linear
from rlkit.backends.local.row_lora import SITES as _SITES
from rlkit.backends.local.row_lora import PackedAdapter, PackedCache, RowLora, RowLoraHooks
from rlkit.backends.local.scoring import score_many
from rlkit.backends.local.token_choice import pick_tokens
from rlkit.types import (
    SampledSequence,
    SampleResponse,
    SamplingParams,
    StopReason,
    TokenLogprob,
    TokenUsage,
)

log = logging.getLogger(__name__)
Adapter = Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]
#: a batch that starts with one set of LoRA weights merges them (see the module docstring)
MERGE_SINGLE = True
_seed_counter = itertools.count(1)


@dataclass
class SampleRequest:
    prompt: List[int]
    num_samples: int
    params: SamplingParams
    include_prompt_logprobs: bool = False
    topk_prompt_logprobs: Optional[int] = None
    # Called on the sampler thread as each token is chosen: ``on_token(sample_index, token_id)``
    # (``sample_index`` in ``range(num_samples)``). Must return quickly; an exception disables it.
    on_token: Optional[Callable[[int, int], None]] = None
    # Token ids that end a sample, replacing the model's end-of-turn tokens (``[]``: none, run to
    # ``max_tokens``); ``None`` keeps them. Text ``params.stop`` sequences apply either way.
    stop_token_ids: Optional[Sequence[int]] = None
    seed: int = field(init=False)
    # the weights this request samples from (for_weights); None: whatever the sampler has set
    weights_key: Optional[str] = field(default=None, init=False)
    adapter: Any = field(default=None, init=False, repr=False)
    _generator: Optional[torch.Generator] = field(default=None, init=False, repr=False)
    _heard: Dict[int, int] = field(default_factory=dict, init=False, repr=False)  # tokens on_token heard, per sample
    _matchers: Any = field(default=None, init=False, repr=False)  # constraints.RowMatchers, when params.constraint is set

    def __post_init__(self) -> None:
        seed = self.params.seed if self.params.seed is not None else (torch.initial_seed() + next(_seed_counter)) % 2**63
        self.seed = int(seed)

    def for_weights(self, key: str, adapter: Any) -> "SampleRequest":
        """Sample from ``adapter`` (``None``: the base model; a LoRA ``{path: (A, B, scale)}``, or
        :class:`~.engine.FullWeights`), named ``key`` (\"\" = base); returns ``self``."""
        self.weights_key, self.adapter = key, adapter
        return self

    def restart(self) -> None:
        """Make this request decode again from its start (after the batch it shared failed): a
        fresh generator from the same seed, and a listener that skips the tokens it already heard."""
        self._generator = None
        self._matchers = None
        if self.on_token is not None:
            skip, listener, seen = dict(self._heard), self.on_token, {}

            def replay(i: int, token: int) -> None:
                seen[i] = seen.get(i, 0) + 1
                if seen[i] > skip.get(i, 0):
                    listener(i, token)

            self.on_token = replay
            self._heard = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """This request's generator on ``device``, made (and seeded) at its first draw. The same
        seed gives the same samples on the same kind of device (CPU and CUDA generators differ)."""
        if self._generator is None:
            self._generator = make_generator(device, self.seed)
        return self._generator


@dataclass
class _Flight:
    """A request being decoded: its samples' tokens, logprobs and stop reasons so far."""

    request: SampleRequest
    budget: int
    tokens: List[List[int]] = field(init=False)
    logprobs: List[List[float]] = field(init=False)
    reasons: List[StopReason] = field(init=False)
    finished: int = 0
    dropped: bool = False  # cancelled: no response
    response: Optional[SampleResponse] = None  # built once, when the last sample ends

    def __post_init__(self) -> None:
        n = self.request.num_samples
        self.tokens, self.logprobs, self.reasons = [[] for _ in range(n)], [[] for _ in range(n)], [StopReason.LENGTH] * n


def _get_submodule(root: torch.nn.Module, path: str) -> torch.nn.Module:
    return root.get_submodule(path)


class Sampler:
    """Decodes batches of :class:`SampleRequest`, merged or per-row (see the module docstring),
    on the device of ``base_model``."""

    def __init__(self, base_model: torch.nn.Module, tokenizer: Any, stop_token_ids: Sequence[int], *, precision: str = "fp32",
                 fused: bool = True):
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.base = base_model  # pristine weights, shared with every trainer of the process, never modified
        # its own module tree over the base's tensors (no copy) in the base's precision; in another
        # precision one converted copy. Merging an adapter copies a shared weight first (set_weights).
        self.model = share_base(base_model, self.dtype).eval()
        self.device = next(self.model.parameters()).device
        self.decoder = self.model.get_decoder()
        self.lm_head = self.model.get_output_embeddings()
        self.tokenizer = tokenizer
        self.stop_token_ids = set(int(t) for t in stop_token_ids)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.vocab_size = int(self.model.config.vocab_size)
        reason = fused_unsupported_reason(self.model) if fused else "fused=False"
        self.fused: Optional[FusedWeights] = None
        if reason is None:
            linear, kernel = F.linear, "F.linear"
            if self.dtype == torch.float32 and self.device.type == "cpu":
                linear, kernel = fp32_linear()
            self.fused = FusedWeights(self.model, linear=linear)
            self.decode_path = f"fused {self.model.config.model_type} decode, shared-prompt attention, {kernel}"
        else:
            self.decode_path = f"the model's own forward ({reason})"
        self.graphed = None  # CUDA: static-shape buckets replayed from CUDA graphs (the CPU path is unchanged)
        if self.fused is not None and self.device.type == "cuda":
            from rlkit.backends.local.cuda_decode import GraphedDecoder

            self.graphed = GraphedDecoder(self.fused)
            self.decode_path += ", static buckets" + (" under CUDA graphs" if self.graphed.use_graphs else " (CUDA graphs off)")
        log.debug("sampler: %s", self.decode_path)
        self.weights_key: Optional[str] = ""  # "" = base model
        self.hooks = RowLoraHooks(self.model)  # per-row LoRA inside the model's own forward
        self._layout = self.fused.lora_layout() if self.fused is not None else None
        # the layers an adapter may adapt and still be routed per row: the lean decode's seven
        # projections per layer, or (the model's own loop) any linear layer but the output head
        self._routable = ({f"{prefix}.{parent}.{n}" for prefix, _ in self._layout for _, parent, names in _SITES for n in names}
                          if self._layout is not None else
                          {n for n, m in self.model.named_modules() if isinstance(m, torch.nn.Linear) and m is not self.lm_head})
        self.packs = PackedCache(self.device, self.dtype, self._layout, self.hooks.install)  # per-row adapters
        self.per_row = False  # the running batch's mode (see the module docstring)
        self._keys_seen: set = set()  # the running batch's weights keys, joined ones included
        self.mixing = False  # the running or last batch holds several weights keys: the next starts per-row
        self._batch_key: Optional[str] = None  # a merged batch's weights key (None: as set by set_weights)
        self._merged: set[str] = set()
        self._owned: set[str] = set()  # merged modules whose weight is the sampler's own copy
        self._written: set[str] = set()  # parameters set from full fine-tuning weights
        self._replaced: set[str] = set()  # ... of those, the ones now the sampler's own copy

    # -- weights ------------------------------------------------------------------------------------
    @torch.no_grad()
    def set_weights(self, key: str, adapter: Optional[Adapter]) -> None:
        """Merge ``adapter`` (``None`` = base model) into the sampling copy; ``key`` names it. A
        full fine-tuning session's weights (``{parameter name: tensor}``) replace those parameters."""
        if key == self.weights_key:
            return
        self._set_parameters(None)
        for path in list(self._merged):  # restore base weights
            module, base_w = _get_submodule(self.model, path), _get_submodule(self.base, path).weight
            if path in self._owned:  # a copy made for merging: point back at the shared base
                module.weight = base_w
                self._owned.discard(path)
            else:  # a view of a fused matrix, or a converted copy
                module.weight.copy_(base_w.to(self.dtype))
        self._merged.clear()
        if isinstance(adapter, FullWeights):
            self._set_parameters(adapter)
            adapter = None
        for path, (a, b, scale) in (adapter or {}).items():
            module, base_w = _get_submodule(self.model, path), _get_submodule(self.base, path).weight
            a, b = (t.to(device=base_w.device, dtype=torch.float32) for t in (a, b))  # checkpoints load on the CPU
            merged = base_w.float() + scale * (b @ a)
            if shares_storage(module.weight, base_w):  # never write the shared base: copy on write
                module.weight = torch.nn.Parameter(merged.to(self.dtype), requires_grad=False)
                self._owned.add(path)
            else:
                module.weight.copy_(merged.to(self.dtype))
            self._merged.add(path)
        self.weights_key = key

    def _set_parameters(self, weights: Optional[FullWeights]) -> None:
        """Parameters named in ``weights`` (``None``: those set before, back to the base's), every
        tied alias too, never writing the shared base: a parameter that is the base's own tensor is
        replaced by a new one (copy on write), another (a fused view, a converted copy) written in place."""
        aliases: Dict[int, List[str]] = {}
        for n, p in self.model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(n)

        def point(name: str, param: torch.nn.Parameter) -> None:
            for alias in aliases[id(self.model.get_parameter(name))]:
                owner, _, attr = alias.rpartition(".")
                setattr(self.model.get_submodule(owner), attr, param)

        for name in list(weights) if weights is not None else sorted(self._written):
            current, base = self.model.get_parameter(name), self.base.get_parameter(name)
            if weights is None and name in self._replaced:
                point(name, base)
            elif weights is None:
                current.copy_(base.to(self.dtype))
            elif shares_storage(current, base):
                point(name, torch.nn.Parameter(weights[name].to(device=base.device, dtype=self.dtype), requires_grad=False))
                self._replaced.add(name)
            else:
                current.copy_(weights[name].to(device=current.device, dtype=self.dtype))
            self._written.add(name)
        if weights is None:
            self._written.clear()
            self._replaced.clear()

    # -- scoring ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prompt_logprobs(self, tokens: List[int], topk: Optional[int] = None,
                        lora: Optional[PackedAdapter] = None) -> Tuple[List[Optional[float]], Optional[list]]:
        """``[None, log p(t1|t0), ...]`` and optionally the top-k alternatives per position, under
        the weights set, plus ``lora`` unmerged (over base weights: :meth:`score` arranges that)."""
        if len(tokens) < 2:
            return [None], ([None] if topk else None)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        # the last token is only a target, never an input: T tokens take T - 1 positions, so a
        # sequence one longer than the context window (lm-eval's scoring windows) still fits
        with self.hooks.routed(RowLora([lora], self.device) if lora is not None else None):
            hidden = self.decoder(input_ids=ids[:, :-1]).last_hidden_state[0]
        logprobs = torch.log_softmax(output_logits(self.lm_head, hidden, logit_softcap(self.model.config)), dim=-1)  # [T-1, V]
        picked = logprobs.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        values: List[Optional[float]] = [None, *picked.tolist()]
        top = None
        if topk:
            vals, idx = logprobs.topk(topk, dim=-1)
            top = [None] + [
                [TokenLogprob(token_id=int(i), logprob=float(v)) for v, i in zip(vs, ix)] for vs, ix in zip(vals.tolist(), idx.tolist())
            ]
        return values, top

    def score(self, tokens: List[int], key: str, adapter: Any) -> List[Optional[float]]:
        """``compute_logprobs`` of ``tokens`` under the weights ``adapter`` named ``key``: with those
        weights merged when they already are (or are full fine-tuning weights, or cannot be routed
        per row), else over the base weights with the adapter unmerged (no merge per key)."""
        if key == self.weights_key or adapter is None or self.routable(adapter) is not None:
            self.set_weights(key, adapter)
            return self.prompt_logprobs(tokens)[0]
        self.set_weights("", None)
        return self.prompt_logprobs(tokens, lora=self.packs.pack(key, adapter))[0]

    def score_batch(self, seqs: Sequence[List[int]], key: str, adapter: Any) -> List[List[Optional[float]]]:
        """``compute_logprobs`` of several sequences under the same weights: merged, shared prefixes
        computed once (:func:`.scoring.score_many`); one at a time where they would be scored per row."""
        if len(seqs) == 1 or not (key == self.weights_key or adapter is None or self.routable(adapter) is not None):
            return [self.score(list(s), key, adapter) for s in seqs]
        self.set_weights(key, adapter)
        with self.hooks.routed(None):
            return score_many(self, seqs)

    # -- per-row weights ----------------------------------------------------------------------------
    def routable(self, adapter: Any) -> Optional[str]:
        """``None`` when ``adapter`` (a request's weights) can share a decode with other adapters
        (per row), else why not: full fine-tuning weights, or a layer the decode cannot route."""
        if adapter is None:
            return None
        if isinstance(adapter, FullWeights):
            return "full fine-tuning weights decode alone (merged)"
        odd = sorted(set(adapter) - self._routable)
        return f"layer {odd[0]} cannot be routed per row" if odd else None

    def _rows_lora(self, requests: Sequence[SampleRequest]) -> Optional[RowLora]:
        """The per-row routing of rows whose requests are ``requests`` (``None`` in merged mode)."""
        if not self.per_row:
            return None
        packed: Dict[int, Optional[PackedAdapter]] = {}
        for r in requests:
            if id(r) not in packed:
                packed[id(r)] = self.packs.pack(r.weights_key, r.adapter)  # type: ignore[arg-type]
        return RowLora([packed[id(r)] for r in requests], self.device, self.packs.stack)


    def _begin(self, requests: Sequence[SampleRequest]) -> None:
        """Set the weights and mode for a batch of ``requests`` (see the module docstring)."""
        keys = {r.weights_key for r in requests}
        self.per_row, self._batch_key, self._keys_seen = False, None, set()
        self._see(keys)
        if keys == {None}:  # requests without weights: the ones set_weights set
            return
        if None in keys:
            raise ValueError("a batch mixes requests with weights (for_weights) and without")
        first = requests[0]
        if len(keys) == 1 and ((MERGE_SINGLE and not self.mixing) or self.routable(first.adapter) is not None):
            self.set_weights(first.weights_key, first.adapter)  # type: ignore[arg-type]
            self._batch_key = first.weights_key
            return
        self._go_per_row(requests)

    def _go_per_row(self, requests: Sequence[SampleRequest]) -> None:
        for r in requests:
            reason = r.weights_key is None and "a request without weights" or self.routable(r.adapter)
            if reason:
                raise ValueError(f"weights {r.weights_key!r} cannot share a decode with other weights: {reason}")
        self.set_weights("", None)
        self.per_row = True

    def _see(self, keys: Iterable[Optional[str]]) -> None:
        """The running batch holds ``keys`` too; two or more make it (and the next batch's start) mixing."""
        self._keys_seen.update(keys)
        self.mixing = self.mixing or len(self._keys_seen - {None}) > 1

    def _admit_weights(self, joining: Sequence[SampleRequest], live: Sequence[SampleRequest]) -> None:
        """Requests joining a running batch: a merged batch that admits other weights turns per-row."""
        self._see(r.weights_key for r in joining)
        if self.per_row:
            self._go_per_row(joining)
        elif any(r.weights_key != self._batch_key for r in joining):
            self._go_per_row([*live, *joining])

    # -- sampling -----------------------------------------------------------------------------------
    def _budget(self, request: SampleRequest) -> int:
        return min(request.params.max_tokens, self.max_positions - len(request.prompt))

    def _prefill(self, state: Any, requests: Sequence[SampleRequest]):
        """:meth:`_prefill_block` of ``requests``, or, when their distinct prompts pass
        :attr:`PREFILL_TOKENS` padded tokens and the decode takes joins (the fused CPU decode), of
        parts of them: prompts sorted by length, each part padded only to its own longest and
        prefilled on its own, then the rows put back in request order and the parts' caches made one
        block (:meth:`.decode.FusedDecode.merge_blocks`). What one padded pass gives up to float rounding, with less padding and smaller attention matrices (lm-eval's
        few-shot prompts: a hundred prompts of 600-1,200 tokens). Returns ``(state, first logits of
        the new rows)`` in request order."""
        parts = self._prefill_parts(requests)
        if len(parts) == 1:
            return self._prefill_block(state, requests)
        base = state.rows if state is not None else 0
        where: Dict[Tuple[int, int], int] = {}  # (request, sample) -> its row in the state
        firsts = []
        for part in parts:
            state, first = self._prefill_block(state, [requests[j] for j in part])
            firsts.append(first)
            for j in part:
                for s in range(requests[j].num_samples):
                    where[(j, s)] = base + len(where)
        order = [where[(j, s)] for j, r in enumerate(requests) for s in range(r.num_samples)]
        state.keep(torch.tensor(list(range(base)) + order, dtype=torch.long, device=self.device))
        state.merge_blocks()  # decode steps attend to one block, as after one pass
        return state, torch.cat(firsts)[torch.tensor(order, dtype=torch.long, device=self.device) - base]

    #: padded prompt tokens one prefill pass computes at most when the prompts are many (see :meth:`_prefill`)
    PREFILL_TOKENS = 8192

    def _prefill_parts(self, requests: Sequence[SampleRequest]) -> List[List[int]]:
        """One part unless the decode can join prompt blocks (:func:`.batching.prefill_parts`)."""
        if self.fused is None or self.graphed is not None:
            return [list(range(len(requests)))]
        keys = [(tuple(r.prompt), r.weights_key if self.per_row else None) for r in requests]
        return prefill_parts(keys, [len(r.prompt) for r in requests], self.PREFILL_TOKENS)

    def _prefill_block(self, state: Any, requests: Sequence[SampleRequest]):
        """Prefill every distinct prompt of ``requests`` once (left-padded; requests with the same
        prompt share it) and start ``state`` (``None``) or add their rows to it. Returns
        ``(state, first logits of the new rows)``. Per-row, a prompt is shared by requests of the
        same weights only, and each prompt is prefilled through its weights' adapter."""
        unique: Dict[tuple, int] = {}
        owner: Dict[int, SampleRequest] = {}
        prompt_of = []
        for r in requests:
            index = unique.setdefault((tuple(r.prompt), r.weights_key if self.per_row else None), len(unique))
            owner.setdefault(index, r)
            prompt_of.append(index)
        prompts = [p for p, _ in unique]
        lora = self._rows_lora([owner[i] for i in range(len(prompts))])
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
        row_prompt = torch.tensor([prompt_of[i] for i, r in enumerate(requests) for _ in range(r.num_samples)], device=self.device)
        with self.hooks.routed(lora):
            if state is None:
                if self.graphed is not None and not self.per_row:  # CUDA graphs: one set of weights
                    state = self.graphed.start(ids, mask, positions, row_prompt)
                else:
                    state = start_decode(self.fused or self.model, ids, mask, positions, row_prompt)
                return state, state.first_logits
            return state, state.join(ids, mask, positions, row_prompt)

    @torch.inference_mode()
    def sample(
        self,
        requests: Sequence[SampleRequest],
        *,
        admit: Optional[Callable[[int], List[SampleRequest]]] = None,
        on_done: Optional[Callable[[SampleRequest, Optional[SampleResponse]], None]] = None,
        cancelled: Optional[Callable[[SampleRequest], bool]] = None,
    ) -> List[Optional[SampleResponse]]:
        """Decode ``requests`` together; return their responses, in order (``None`` for a request
        that ``cancelled(request)`` dropped).

        ``admit(live_rows)`` is asked between decode steps for more requests to join the running
        batch: continuous batching, where the decode loop supports it
        (:attr:`.decode.FusedDecode.can_join`); requests of other LoRA weights than the batch's
        turn it per-row (see the module docstring). ``on_done(request, response)`` hears every
        request, the admitted ones included, as soon as its last sample ends (``None``: dropped).
        A request's weights are its :meth:`SampleRequest.for_weights` (unset on all: those of
        :meth:`set_weights`)."""
        flights = [_Flight(r, self._budget(r)) for r in requests]
        live: List[Tuple[_Flight, int]] = [(f, i) for f in flights for i in range(f.request.num_samples)]
        self._begin(requests)
        state, logits = self._prefill(None, requests)
        while live:
            if cancelled is not None:
                gone = {id(f): f for f in {id(f): f for f, _ in live}.values() if cancelled(f.request)}
                if gone:  # drop the rows of requests the caller gave up on
                    for flight in gone.values():
                        flight.dropped = True
                        if on_done is not None:
                            on_done(flight.request, None)
                    keep = [row for row, (f, _) in enumerate(live) if id(f) not in gone]
                    if not keep:
                        break
                    index = torch.tensor(keep, dtype=torch.long, device=self.device)
                    state.keep(index)
                    logits = logits[index]
                    live = [live[row] for row in keep]
            chosen, chosen_lp = self._pick(logits, [f.request for f, _ in live], self._allowed(live))
            keep: List[int] = []
            for row, ((flight, i), tok, lp) in enumerate(zip(live, chosen.tolist(), chosen_lp.tolist())):
                if self._record(flight, i, tok, lp):
                    keep.append(row)
                elif flight.finished == flight.request.num_samples and on_done is not None:
                    on_done(flight.request, self._response(flight))
            if len(keep) < len(live):
                if keep:
                    index = torch.tensor(keep, dtype=torch.long, device=self.device)
                    state.keep(index)
                    chosen = chosen[index]
                live = [live[row] for row in keep]
            if live:
                lora = self._rows_lora([f.request for f, _ in live])
                with self.hooks.routed(lora):  # the model's own loop applies it by hooks, the lean one itself
                    logits = state.step(chosen) if lora is None else state.step(chosen, lora)
            else:
                logits = None
            joining = admit(len(live)) if admit is not None and live and state.can_join else []
            if joining:
                self._admit_weights(joining, [f.request for f, _ in live])
                state, first = self._prefill(state, joining)
                for request in joining:
                    flight = _Flight(request, self._budget(request))
                    live += [(flight, i) for i in range(request.num_samples)]
                logits = first if logits is None else torch.cat([logits, first])
        self.mixing = len(self._keys_seen - {None}) > 1
        return [None if f.dropped else self._response(f) for f in flights]

    def _record(self, flight: "_Flight", i: int, token: int, logprob: float) -> bool:
        """Append sample ``i``'s new token; ``True`` while the sample goes on."""
        request = flight.request
        flight.tokens[i].append(token)
        flight.logprobs[i].append(logprob)
        if request.on_token is not None:
            self._notify(request, i, token)
        params = request.params
        stops = self.stop_token_ids if request.stop_token_ids is None else request.stop_token_ids
        if token in stops or (params.stop and self._hit_stop(flight.tokens[i], params.stop)):
            flight.reasons[i] = StopReason.STOP
        elif request._matchers is not None and request._matchers.advance(i, token, stops, len(flight.tokens[i]) >= flight.budget):
            flight.reasons[i] = StopReason.STOP  # the grammar is complete
        elif len(flight.tokens[i]) < flight.budget:
            return True
        flight.finished += 1
        return False

    def _response(self, flight: "_Flight") -> SampleResponse:
        if flight.response is not None:
            return flight.response
        r = flight.request
        seqs = [SampledSequence(stop_reason=reason, tokens=t, logprobs=lp) for t, lp, reason in zip(flight.tokens, flight.logprobs, flight.reasons)]
        prompt_lp, top = (None, None)
        if r.include_prompt_logprobs or r.topk_prompt_logprobs:
            lora = self.packs.pack(r.weights_key, r.adapter) if self.per_row else None  # type: ignore[arg-type]
            prompt_lp, top = self.prompt_logprobs(r.prompt, r.topk_prompt_logprobs, lora)
        usage = TokenUsage(prefill_tokens=len(r.prompt), decode_tokens=sum(len(t) for t in flight.tokens))  # as billed per request
        flight.response = SampleResponse(
            sequences=seqs,
            prompt_logprobs=prompt_lp if r.include_prompt_logprobs else None,
            topk_prompt_logprobs=top,
            usage=usage,
        )
        return flight.response

    @staticmethod
    def _notify(request: SampleRequest, index: int, token: int) -> None:
        request._heard[index] = request._heard.get(index, 0) + 1
        try:
            request.on_token(index, token)
        except Exception:  # noqa: BLE001 - a listener's failure must not fail the batch it shares
            log.exception("on_token callback failed; disabling it for this request")
            request.on_token = None

    def _allowed(self, live: Sequence[Tuple["_Flight", int]]) -> Optional[torch.Tensor]:
        """``[rows, V]`` bool: the tokens each row's constraint allows next (``None``: no row has one)."""
        if all(f.request.params.constraint is None for f, _ in live):
            return None
        from rlkit import constraints

        allowed = torch.ones((len(live), self.vocab_size), dtype=torch.bool)
        for row, (flight, i) in enumerate(live):
            request = flight.request
            if request.params.constraint is None:
                continue
            if request._matchers is None:
                eos = constraints.end_tokens(self.tokenizer, self.stop_token_ids)
                pristine = constraints.compiled(self.tokenizer, self.vocab_size, eos, request.params.constraint)
                request._matchers = constraints.RowMatchers(pristine, eos, constraints.closing_tokens(self.tokenizer))
            allowed[row] = request._matchers.allowed([i], self.vocab_size, [flight.budget - len(flight.tokens[i])])[0]
        return allowed.to(self.device)

    def _pick(self, logits: torch.Tensor, row_requests: List[SampleRequest], allowed: Optional[torch.Tensor] = None):
        """Each row's next token and its logprob (:func:`rlkit.backends.local.token_choice.pick_tokens`)."""
        return pick_tokens(logits, row_requests, allowed)

    def _hit_stop(self, tokens: List[int], stops: List[str]) -> bool:
        longest = max(len(s) for s in stops)
        tail = self.tokenizer.decode(tokens[-(longest + 8):], skip_special_tokens=False)
        return any(s in tail for s in stops)
