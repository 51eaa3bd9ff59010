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

A request may carry an ``on_token`` listener (what ``rlkit serve`` streams from): it hears each
token the moment it is chosen, before the batch finishes. A request the caller gave up on
(``cancelled(i)`` true) loses its rows at the next decode step, so the rest of the batch — and the
next batch — no longer pay for it.

Temperatures below :data:`rlkit.types.GREEDY_TEMPERATURE` (1e-6) are greedy, like ``0``: dividing
float32 logits by ``1e-45`` makes them ±inf and the softmax NaN, while the limit of
``softmax(logits / T)`` as T -> 0 is the argmax; the reported logprob is then the greedy one (T = 1).
"""

from __future__ import annotations

import copy
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from rlkit.backends.local.decode import FusedWeights, fused_unsupported_reason, start_decode
from rlkit.backends.local.device import generator as make_generator
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

    def __post_init__(self) -> None:
        seed = self.params.seed if self.params.seed is not None else (torch.initial_seed() + next(_seed_counter)) % 2**63
        self.seed = int(seed)

    def generator(self, device: torch.device) -> torch.Generator:
        """This request's generator on ``device``, made (and seeded) at its first draw. The same
        seed gives the same samples on the same kind of device (CPU and CUDA generators differ)."""
        if self._generator is None:
            self._generator = make_generator(device, self.seed)
        return self._generator


def _get_submodule(root: torch.nn.Module, path: str) -> torch.nn.Module:
    return root.get_submodule(path)


class Sampler:
    """Decodes batches of :class:`SampleRequest` with one merged set of adapter weights, on the
    device of ``base_model``."""

    def __init__(self, base_model: torch.nn.Module, tokenizer: Any, stop_token_ids: Sequence[int], *, precision: str = "fp32",
                 fused: bool = True):
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.base = base_model  # pristine fp32 weights, never modified
        self.model = copy.deepcopy(base_model).to(self.dtype).eval()
        self.device = next(self.model.parameters()).device
        for p in self.model.parameters():
            p.requires_grad_(False)
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
        log.debug("sampler: %s", self.decode_path)
        self.weights_key: Optional[str] = ""  # "" = base model
        self._merged: set[str] = set()

    # -- weights ------------------------------------------------------------------------------------
    @torch.no_grad()
    def set_weights(self, key: str, adapter: Optional[Adapter]) -> None:
        """Merge ``adapter`` (``None`` = base model) into the sampling copy; ``key`` names it."""
        if key == self.weights_key:
            return
        for path in list(self._merged):  # restore base weights
            target = _get_submodule(self.model, path).weight
            target.copy_(_get_submodule(self.base, path).weight.to(self.dtype))
        self._merged.clear()
        for path, (a, b, scale) in (adapter or {}).items():
            base_w = _get_submodule(self.base, path).weight
            a, b = (t.to(device=base_w.device, dtype=torch.float32) for t in (a, b))  # checkpoints load on the CPU
            merged = base_w.float() + scale * (b @ a)
            _get_submodule(self.model, path).weight.copy_(merged.to(self.dtype))
            self._merged.add(path)
        self.weights_key = key

    # -- scoring ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prompt_logprobs(self, tokens: List[int], topk: Optional[int] = None) -> Tuple[List[Optional[float]], Optional[list]]:
        """``[None, log p(t1|t0), ...]`` and optionally the top-k alternatives per position."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        hidden = self.decoder(input_ids=ids).last_hidden_state[0]
        logprobs = torch.log_softmax(self.lm_head(hidden).float(), dim=-1)  # [T, V]
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
    @torch.inference_mode()
    def sample(
        self, requests: Sequence[SampleRequest], cancelled: Optional[Callable[[int], bool]] = None
    ) -> List[Optional[SampleResponse]]:
        """One response per request; ``None`` for a request that ``cancelled(index)`` dropped."""
        # Prefill every distinct prompt once (left-padded; requests with the same prompt share it),
        # then give each sample row its prompt's cache row.
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

        row_req = [i for i, r in enumerate(requests) for _ in range(r.num_samples)]
        row_prompt = torch.tensor([prompt_of[i] for i in row_req], dtype=torch.long, device=self.device)
        live = list(range(len(row_req)))  # row -> global sample index
        tokens: List[List[int]] = [[] for _ in live]
        logps: List[List[float]] = [[] for _ in live]
        reasons: List[StopReason] = [StopReason.LENGTH for _ in live]
        budget = [min(requests[r].params.max_tokens, self.max_positions - len(requests[r].prompt)) for r in row_req]
        first_row = [0] * len(requests)  # global row of each request's sample 0
        for i in range(1, len(requests)):
            first_row[i] = first_row[i - 1] + requests[i - 1].num_samples
        state = start_decode(self.fused or self.model, ids, mask, positions, row_prompt, max(budget))
        logits = state.first_logits

        dropped: set[int] = set()
        while live:
            if cancelled is not None:
                newly = {r for r in {row_req[g] for g in live} if r not in dropped and cancelled(r)}
                if newly:  # drop the rows of requests the caller gave up on
                    dropped |= newly
                    keep = [row for row, g in enumerate(live) if row_req[g] not in dropped]
                    if not keep:
                        break
                    index = torch.tensor(keep, dtype=torch.long, device=self.device)
                    state.keep(index)
                    logits = logits[index]
                    live = [live[row] for row in keep]
            chosen, chosen_lp = self._pick(logits, [row_req[g] for g in live], requests)
            keep: List[int] = []
            for row, (g, tok, lp) in enumerate(zip(live, chosen.tolist(), chosen_lp.tolist())):
                tokens[g].append(tok)
                logps[g].append(lp)
                request = requests[row_req[g]]
                if request.on_token is not None:
                    self._notify(request, g - first_row[row_req[g]], tok)
                params = request.params
                stops = self.stop_token_ids if request.stop_token_ids is None else request.stop_token_ids
                if tok in stops or (params.stop and self._hit_stop(tokens[g], params.stop)):
                    reasons[g] = StopReason.STOP
                elif len(tokens[g]) < budget[g]:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep, dtype=torch.long, device=self.device)
                state.keep(index)
                chosen = chosen[index]
                live = [live[row] for row in keep]
            logits = state.step(chosen)

        responses: List[Optional[SampleResponse]] = []
        start = 0
        for k, r in enumerate(requests):
            rows = range(start, start + r.num_samples)
            start += r.num_samples
            if k in dropped:
                responses.append(None)
                continue
            seqs = [SampledSequence(stop_reason=reasons[g], tokens=tokens[g], logprobs=logps[g]) for g in rows]
            prompt_lp, top = (None, None)
            if r.include_prompt_logprobs or r.topk_prompt_logprobs:
                prompt_lp, top = self.prompt_logprobs(r.prompt, r.topk_prompt_logprobs)
            usage = TokenUsage(prefill_tokens=len(r.prompt), decode_tokens=sum(len(tokens[g]) for g in rows))  # as billed per request
            responses.append(
                SampleResponse(
                    sequences=seqs,
                    prompt_logprobs=prompt_lp if r.include_prompt_logprobs else None,
                    topk_prompt_logprobs=top,
                    usage=usage,
                )
            )
        return responses

    @staticmethod
    def _notify(request: SampleRequest, index: int, token: int) -> None:
        try:
            request.on_token(index, token)
        except Exception:  # noqa: BLE001 - a listener's failure must not fail the batch it shares
            log.exception("on_token callback failed; disabling it for this request")
            request.on_token = None

    def _pick(self, logits: torch.Tensor, req_rows: List[int], requests: Sequence[SampleRequest]):
        """Choose one token per row; return ``(tokens, logprobs under softmax(logits/T))``.

        A request's rows are contiguous, so each request's block is a view of ``logits``; the
        logprob is ``z[y] - logsumexp(z)`` (``z = logits / T``) without a ``[rows, V]`` log-softmax."""
        chosen = torch.empty(len(req_rows), dtype=torch.long, device=logits.device)
        chosen_lp = torch.empty(len(req_rows), device=logits.device)
        start = 0
        for r, run in itertools.groupby(req_rows):
            end = start + len(list(run))
            params = requests[r].params
            block = logits[start:end]
            temperature = 1.0 if params.temperature is None else params.temperature
            greedy = temperature < GREEDY_TEMPERATURE or params.top_k == 1
            scaled = block if greedy or temperature == 1.0 else block / temperature
            picked = scaled.argmax(-1) if greedy else self._draw(scaled, params, requests[r].generator(logits.device))
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
