"""Batched KV-cache decoding for the local backend.

The sampler owns its own copy of the model (in the sampling precision) and a set of adapter
weights *merged* into it (``W = W_base + scale * B @ A``), so it never shares mutable state with
the trainer: a sampling client bound to a checkpoint keeps seeing that checkpoint.

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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from rlkit.backends.local.decode import FusedWeights, fused_unsupported_reason, start_decode
from rlkit.backends.local.device import generator as make_generator
from rlkit.backends.local.engine import FullWeights
from rlkit.backends.local.families import logit_softcap, output_logits
from rlkit.backends.local.models import share_base, shares_storage
from rlkit.backends.local.precision import fp32_linear
from rlkit.types import (
    GREEDY_TEMPERATURE,
    SampledSequence,
    SampleResponse,
    SamplingParams,
    StopReason,
    TokenLogprob,
    TokenUsage,
)

log = logging.getLogger(__name__)
Adapter = Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]
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
    _generator: Optional[torch.Generator] = field(default=None, init=False, repr=False)
    _heard: Dict[int, int] = field(default_factory=dict, init=False, repr=False)  # tokens on_token heard, per sample
    _matchers: Any = field(default=None, init=False, repr=False)  # constraints.RowMatchers, when params.constraint is set

    def __post_init__(self) -> None:
        seed = self.params.seed if self.params.seed is not None else (torch.initial_seed() + next(_seed_counter)) % 2**63
        self.seed = int(seed)

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
    """Decodes batches of :class:`SampleRequest` with one merged set of adapter weights, on the
    device of ``base_model``."""

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
    def prompt_logprobs(self, tokens: List[int], topk: Optional[int] = None) -> Tuple[List[Optional[float]], Optional[list]]:
        """``[None, log p(t1|t0), ...]`` and optionally the top-k alternatives per position."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        hidden = self.decoder(input_ids=ids).last_hidden_state[0]
        logprobs = torch.log_softmax(output_logits(self.lm_head, hidden, logit_softcap(self.model.config)), dim=-1)  # [T, V]
        picked = logprobs[:-1].gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        values: List[Optional[float]] = [None, *picked.tolist()]
        top = None
        if topk:
            vals, idx = logprobs[:-1].topk(topk, dim=-1)
            top = [None] + [
                [TokenLogprob(token_id=int(i), logprob=float(v)) for v, i in zip(vs, ix)] for vs, ix in zip(vals.tolist(), idx.tolist())
            ]
        return values, top

    # -- sampling -----------------------------------------------------------------------------------
    def _budget(self, request: SampleRequest) -> int:
        return min(request.params.max_tokens, self.max_positions - len(request.prompt))

    def _prefill(self, state: Any, requests: Sequence[SampleRequest]):
        """Prefill every distinct prompt of ``requests`` once (left-padded; requests with the same
        prompt share it) and start ``state`` (``None``) or add their rows to it. Returns
        ``(state, first logits of the new rows)``."""
        unique: Dict[tuple, int] = {}
        prompt_of = [unique.setdefault(tuple(r.prompt), len(unique)) for r in requests]
        prompts = list(unique)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
        row_prompt = torch.tensor([prompt_of[i] for i, r in enumerate(requests) for _ in range(r.num_samples)], device=self.device)
        if state is None:
            if self.graphed is not None:
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

        ``admit(live_rows)`` is asked between decode steps for more requests (same weights) to
        join the running batch: continuous batching, where the decode loop supports it
        (:attr:`.decode.FusedDecode.can_join`). ``on_done(request, response)`` hears every
        request, the admitted ones included, as soon as its last sample ends (``None``: dropped)."""
        flights = [_Flight(r, self._budget(r)) for r in requests]
        live: List[Tuple[_Flight, int]] = [(f, i) for f in flights for i in range(f.request.num_samples)]
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
            logits = state.step(chosen) if live else None
            joining = admit(len(live)) if admit is not None and live and state.can_join else []
            if joining:
                state, first = self._prefill(state, joining)
                for request in joining:
                    flight = _Flight(request, self._budget(request))
                    live += [(flight, i) for i in range(request.num_samples)]
                logits = first if logits is None else torch.cat([logits, first])
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
            prompt_lp, top = self.prompt_logprobs(r.prompt, r.topk_prompt_logprobs)
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
        """Choose one token per row (``row_requests``: each row's request; a request's rows are
        contiguous) among the ``allowed`` ones (``[rows, V]`` bool, ``None``: all); return
        ``(tokens, logprobs under softmax(logits/T))``.

        Each request's block is a view of ``logits``; the logprob is ``z[y] - logsumexp(z)``
        (``z = logits / T``), without a ``[rows, V]`` log-softmax."""
        chosen = torch.empty(len(row_requests), dtype=torch.long, device=logits.device)
        chosen_lp = torch.empty(len(row_requests), device=logits.device)
        start = 0
        for _, run in itertools.groupby(row_requests, key=id):
            end = start + len(list(run))
            request = row_requests[start]
            params = request.params
            block = logits[start:end]
            temperature = 1.0 if params.temperature is None else params.temperature
            greedy = temperature < GREEDY_TEMPERATURE or params.top_k == 1
            scaled = block if greedy or temperature == 1.0 else block / temperature
            among = scaled if allowed is None else scaled.masked_fill(~allowed[start:end], float("-inf"))
            picked = among.argmax(-1) if greedy else self._draw(among, params, request.generator(logits.device))
            chosen[start:end] = picked
            chosen_lp[start:end] = scaled.gather(-1, picked.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
            start = end
        return chosen, chosen_lp

    @staticmethod
    def _draw(scaled: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
        filtered = scaled
        if params.top_k is not None and params.top_k > 0 and params.top_k < scaled.shape[-1]:
            kth = scaled.topk(params.top_k, dim=-1).values[:, -1:]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if params.top_p is not None and params.top_p < 1.0:
            sorted_logits, order = filtered.sort(dim=-1, descending=True)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= params.top_p  # keep the token that crosses p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            filtered = torch.full_like(filtered, float("-inf")).scatter(-1, order, sorted_logits)
        probs = torch.softmax(filtered, dim=-1)
        # Inverse-CDF sampling: one uniform per row against the cumulative distribution (float64;
        # float32 on MPS, which has no float64). torch.multinomial draws one exponential per
        # vocabulary entry instead, which was 15% of a 64-row decode step on a 49k vocabulary.
        # ``right=True`` never selects a zero-probability (filtered) token: its cumulative value
        # equals its predecessor's. ``generator`` must be on the logits' device.
        wide = torch.float32 if probs.device.type == "mps" else torch.float64
        cdf = torch.cumsum(probs, dim=-1, dtype=wide)
        u = torch.rand((probs.shape[0], 1), generator=generator, dtype=wide, device=probs.device)
        return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)

    def _hit_stop(self, tokens: List[int], stops: List[str]) -> bool:
        longest = max(len(s) for s in stops)
        tail = self.tokenizer.decode(tokens[-(longest + 8):], skip_special_tokens=False)
        return any(s in tail for s in stops)
