"""Decode loops for the sampler: a lean one for Llama-family decoders, the model's own for the rest.

Both start from one prefill of every distinct prompt (left-padded, by the model's own decoder) and
then advance every live sample row by one token per :meth:`step`, dropping finished rows with
:meth:`keep`. :func:`start_decode` picks the implementation.

:class:`FusedDecode` (Llama and Qwen2 decoders, :func:`fused_unsupported_reason` says why not
otherwise) does per step what the model's forward would, with fewer and larger operations:

- **Fused projections.** ``q/k/v`` and ``gate/up`` weights live in one matrix each (the modules'
  weights become views of it, so merging an adapter into a module updates the fused matrix):
  4 matrix products per layer instead of 7, the same bytes read.
- **Shared-prompt attention.** The ``G`` sample rows of one prompt keep the prompt's keys and
  values *once* (``[P, kv_heads, L, d]``) plus their own decoded suffix. Attention is computed in
  two parts merged by their log-sum-exp, the "bifurcated"/"cascade" attention of Hydragen
  (Juravsky et al. 2024, arXiv:2402.05099) and Athiwaratkun et al. 2024 (arXiv:2403.08845)::

      prefix:  s_p = q K_p^T * c,   m_p = max s_p,  l_p = sum exp(s_p - m_p),  o_p = exp(s_p - m_p) V_p
      suffix:  the same over the row's own keys   ->  m_s, l_s, o_s
      out   =  (e^{m_p - m} o_p + e^{m_s - m} o_s) / (e^{m_p - m} l_p + e^{m_s - m} l_s),   m = max(m_p, m_s)

  which is ``softmax(q [K_p; K_s]^T c) [V_p; V_s]`` exactly (in exact arithmetic). The prefix part
  runs as one matrix product per prompt for all its rows' queries, so a prompt's cache is read
  once per step instead of ``G`` times, and it is never copied per row. Keys and values are kept,
  and attention computed, in float32 whatever the weights' precision.
- **No per-step framework work**: no attention-mask tensors, cache objects or module dispatch.

The results equal the model's own forward up to float rounding (``tests/backends/test_local_decode.py``
compares both loops' logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from rlkit.backends.local.kv_cache import GrowingCache

FUSED_MODEL_TYPES = ("llama", "qwen2")


def _prefill(decoder: torch.nn.Module, lm_head: torch.nn.Module, ids, mask, positions, cache):
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    return lm_head(out.last_hidden_state[:, -1]).float()  # [P, V]


class HFDecode:
    """Any causal LM: the model's own decoder over a :class:`~.kv_cache.GrowingCache` in which
    every sample row holds its own copy of its prompt's cache."""

    def __init__(self, decoder, lm_head, ids, mask, positions, row_prompt: torch.Tensor):
        self.decoder, self.lm_head = decoder, lm_head
        self.cache = GrowingCache()
        last = _prefill(decoder, lm_head, ids, mask, positions, self.cache)
        self.cache.batch_select_indices(row_prompt)
        self.first_logits = last[row_prompt]
        self.mask = mask[row_prompt]
        self.next_pos = positions[row_prompt, -1] + 1

    def keep(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        out = self.decoder(input_ids=tokens.view(-1, 1), attention_mask=self.mask, position_ids=self.next_pos.view(-1, 1),
                           cache=self.cache, use_cache=True)
        self.next_pos = self.next_pos + 1
        return self.lm_head(out.last_hidden_state[:, -1]).float()


# -- the lean path ---------------------------------------------------------------------------------------


def fused_unsupported_reason(model: torch.nn.Module) -> Optional[str]:
    """``None`` when :class:`FusedWeights` can run ``model``, else why not (the model's own loop is used)."""
    config = model.config
    if config.model_type not in FUSED_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not one of {FUSED_MODEL_TYPES}"
    decoder = model.get_decoder()
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(decoder, name):
            return f"the decoder has no {name}"
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if getattr(attn, "sliding_window", None) is not None:
            return "sliding-window attention"
        if getattr(config, "hidden_act", "silu") != "silu":
            return f"hidden_act {config.hidden_act!r}"
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        if len({p.bias is None for p in projections}) > 1 or mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
            return "mixed or gate/up projection biases"
    return None


def _fuse(linears: List[torch.nn.Linear]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One matrix (and bias) holding ``linears`` stacked; each module's weight becomes a view of it."""
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
    start = 0
    for m in linears:
        n = m.out_features
        m.weight = torch.nn.Parameter(weight[start : start + n], requires_grad=False)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[start : start + n], requires_grad=False)
        start += n
    return weight, bias


@dataclass
class _Layer:
    module: torch.nn.Module
    wqkv: torch.Tensor
    bqkv: Optional[torch.Tensor]
    split: Tuple[int, int, int]  # q, k, v widths
    intermediate: int
    wgu: torch.Tensor


class FusedWeights:
    """A Llama/Qwen2 causal LM with fused ``qkv`` and ``gate_up`` weights (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, linear=F.linear):
        self.model = model
        self.linear = linear
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        first = self.decoder.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.heads = int(model.config.num_attention_heads)
        self.kv_heads = int(model.config.num_key_value_heads)
        self.scale = float(first.scaling)
        self.layers: List[_Layer] = []
        for layer in self.decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = [attn.q_proj, attn.k_proj, attn.v_proj]
            wqkv, bqkv = _fuse(projections)
            wgu, _ = _fuse([mlp.gate_proj, mlp.up_proj])
            split = tuple(p.out_features for p in projections)
            self.layers.append(_Layer(layer, wqkv, bqkv, split, mlp.gate_proj.out_features, wgu))  # type: ignore[arg-type]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, as the models apply it: ``x cos + rotate_half(x) sin``."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


class FusedDecode:
    """Decode state of :class:`FusedWeights`: prompts' caches once, each row's suffix, and the
    map from rows to prompts (``group``: ``[P, G]`` row indices padded with ``R``, ``slot``: each
    row's place in that layout)."""

    def __init__(self, fused: FusedWeights, ids, mask, positions, row_prompt: torch.Tensor, max_new: int):
        from transformers import DynamicCache

        self.f = fused
        cache = DynamicCache()
        last = _prefill(fused.decoder, fused.lm_head, ids, mask, positions, cache)
        self.prefix = [(layer.keys.float(), layer.values.float()) for layer in cache.layers]  # [P, kv, L, d]
        self.prefix_bias = torch.zeros(mask.shape, dtype=torch.float32, device=ids.device).masked_fill_(mask == 0, float("-inf"))
        self.first_logits = last[row_prompt]
        self.row_prompt = row_prompt
        self.next_pos = positions[row_prompt, -1] + 1
        self.n = 0  # decoded positions held per row
        self.max_new = max(int(max_new), 1)
        rows = row_prompt.shape[0]
        shape = (rows, fused.kv_heads, min(self.max_new, 64), fused.head_dim)
        self.suffix = [(torch.empty(shape, device=ids.device), torch.empty(shape, device=ids.device)) for _ in fused.layers]
        self._regroup()

    def _regroup(self) -> None:
        """Drop prompts with no live rows; rebuild ``group`` / ``slot``."""
        prompts = sorted(set(self.row_prompt.tolist()))
        if len(prompts) < self.prefix_bias.shape[0]:
            keep = torch.tensor(prompts, device=self.row_prompt.device)
            self.prefix = [(k[keep], v[keep]) for k, v in self.prefix]
            self.prefix_bias = self.prefix_bias[keep]
            remap = {p: i for i, p in enumerate(prompts)}
            self.row_prompt = torch.tensor([remap[p] for p in self.row_prompt.tolist()], device=self.row_prompt.device)
        members: List[List[int]] = [[] for _ in prompts]
        for row, p in enumerate(self.row_prompt.tolist()):
            members[p].append(row)
        rows, width = self.row_prompt.shape[0], max(len(m) for m in members)
        group = torch.full((len(prompts), width), rows, dtype=torch.long)
        slot = []
        for p, m in enumerate(members):
            group[p, : len(m)] = torch.tensor(m)
        for row, p in enumerate(self.row_prompt.tolist()):
            slot.append(p * width + members[p].index(row))
        self.group = group.to(self.row_prompt.device)
        self.slot = torch.tensor(slot, device=self.row_prompt.device)
        self.width = width

    def keep(self, index: torch.Tensor) -> None:
        self.suffix = [(k[index], v[index]) for k, v in self.suffix]
        self.row_prompt, self.next_pos = self.row_prompt[index], self.next_pos[index]
        self._regroup()

    def _grow(self) -> None:
        cap = self.suffix[0][0].shape[2]
        if self.n < cap:
            return
        new_cap = max(min(2 * cap, self.max_new), self.n + 1)
        grown = []
        for k, v in self.suffix:
            k2 = k.new_empty((*k.shape[:2], new_cap, k.shape[-1]))
            v2 = v.new_empty((*v.shape[:2], new_cap, v.shape[-1]))
            k2[:, :, : self.n], v2[:, :, : self.n] = k[:, :, : self.n], v[:, :, : self.n]
            grown.append((k2, v2))
        self.suffix = grown

    def _attend(self, i: int, q: torch.Tensor, n: int) -> torch.Tensor:
        """Layer ``i``: queries ``q`` ``[R, heads, d]`` (rotated) against the prompts' cache and the
        first ``n`` positions of each row's suffix; ``[R, heads * d]`` in float32."""
        f = self.f
        rows, kv, rep, d = q.shape[0], f.kv_heads, f.heads // f.kv_heads, f.head_dim
        q = (q.float() * f.scale).view(rows, kv, rep, d)
        kp, vp = self.prefix[i]
        prompts = kp.shape[0]
        padded = torch.cat([q, q.new_zeros((1, kv, rep, d))])[self.group]  # [P, G, kv, rep, d]
        qg = padded.transpose(1, 2).reshape(prompts, kv, self.width * rep, d)
        sp = torch.matmul(qg, kp.transpose(-1, -2)) + self.prefix_bias[:, None, None, :]  # [P, kv, G*rep, L]
        mp = sp.amax(-1, keepdim=True)
        ep = (sp - mp).exp_()
        lp, op = ep.sum(-1, keepdim=True), torch.matmul(ep, vp)

        def to_rows(t: torch.Tensor) -> torch.Tensor:  # [P, kv, G*rep, x] -> [R, kv, rep, x]
            return t.view(prompts, kv, self.width, rep, t.shape[-1]).transpose(1, 2).reshape(prompts * self.width, kv, rep, t.shape[-1])[self.slot]

        mp, lp, op = to_rows(mp), to_rows(lp), to_rows(op)
        ks, vs = self.suffix[i]
        ss = torch.matmul(q, ks[:, :, :n].transpose(-1, -2))  # [R, kv, rep, n]
        ms = ss.amax(-1, keepdim=True)
        es = (ss - ms).exp_()
        ls, os_ = es.sum(-1, keepdim=True), torch.matmul(es, vs[:, :, :n])
        m = torch.maximum(mp, ms)
        ap, as_ = (mp - m).exp_(), (ms - m).exp_()
        return ((ap * op + as_ * os_) / (ap * lp + as_ * ls)).view(rows, kv * rep * d)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        f = self.f
        self._grow()
        x = f.decoder.embed_tokens(tokens)  # [R, hidden]
        cos, sin = f.decoder.rotary_emb(x[:, None], self.next_pos[:, None])  # [R, 1, d]
        rows, s = x.shape[0], self.n
        for i, layer in enumerate(f.layers):
            module = layer.module
            h = module.input_layernorm(x)
            qkv = f.linear(h, layer.wqkv, layer.bqkv)
            nq, nk, _ = layer.split
            q = _rotate(qkv[:, :nq].view(rows, f.heads, f.head_dim), cos, sin)
            k = _rotate(qkv[:, nq : nq + nk].view(rows, f.kv_heads, f.head_dim), cos, sin)
            ks, vs = self.suffix[i]
            ks[:, :, s] = k
            vs[:, :, s] = qkv[:, nq + nk :].view(rows, f.kv_heads, f.head_dim)
            attn = self._attend(i, q, s + 1).to(x.dtype)
            o_proj, down = module.self_attn.o_proj, module.mlp.down_proj
            x = x + f.linear(attn, o_proj.weight, o_proj.bias)
            h = module.post_attention_layernorm(x)
            gate, up = f.linear(h, layer.wgu).split(layer.intermediate, dim=-1)
            x = x + f.linear(module.mlp.act_fn(gate) * up, down.weight, down.bias)
        self.n = s + 1
        self.next_pos = self.next_pos + 1
        return f.linear(f.decoder.norm(x), f.lm_head.weight, f.lm_head.bias).float()


def start_decode(model_or_fused, ids, mask, positions, row_prompt: torch.Tensor, max_new: int):
    """Prefill and return the decode state (``.first_logits`` ``[R, V]``, ``.step``, ``.keep``)."""
    if isinstance(model_or_fused, FusedWeights):
        return FusedDecode(model_or_fused, ids, mask, positions, row_prompt, max_new)
    decoder, lm_head = model_or_fused.get_decoder(), model_or_fused.get_output_embeddings()
    return HFDecode(decoder, lm_head, ids, mask, positions, row_prompt)
