"""Decode loops for the sampler: a lean one for Llama-family decoders, the model's own for the rest.

Both start from one prefill of every distinct prompt (left-padded, by the model's own decoder) and
then advance every live sample row by one token per :meth:`step`, dropping finished rows with
:meth:`keep`. :func:`start_decode` picks the implementation.

:class:`FusedDecode` (Llama, Qwen2, Qwen3 and Mistral decoders — Qwen3's per-head q/k RMSNorm
included — :func:`fused_unsupported_reason` says why not otherwise) does per step what the
model's forward would, with fewer and larger operations:

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
  runs as one attention per prompt for all its rows' queries, so a prompt's cache is read once
  per step instead of ``G`` times, and it is never copied per row. Each part is one call of
  PyTorch's CPU flash-attention kernel, which returns the log-sum-exp ``m + log l`` the merge needs
  (:func:`attention_with_lse`). Keys and values are kept, and attention computed, in float32
  whatever the weights' precision.
- **No per-step framework work**: no attention-mask tensors, cache objects or module dispatch.

The results equal the model's own forward up to float rounding (``tests/backends/test_local_decode.py``
compares both loops' logits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import torch
import torch.nn.functional as F

from rlkit.backends.local.families import logit_softcap, output_logits
from rlkit.backends.local.kv_cache import GrowingCache
from rlkit.backends.local.row_lora import RowLora

FUSED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
#: PyTorch's CPU flash-attention kernel: ``(out, logsumexp, ...)`` for ``(q, k, v, dropout, causal, attn_mask=, scale=)``
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _prefill(decoder: torch.nn.Module, lm_head: torch.nn.Module, ids, mask, positions, cache, softcap=None):
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    return output_logits(lm_head, out.last_hidden_state[:, -1], softcap)  # [P, V] float32


class HFDecode:
    """Any causal LM: the model's own decoder over a :class:`~.kv_cache.GrowingCache` in which
    every sample row holds its own copy of its prompt's cache. Rows cannot join a running batch."""

    can_join = False

    def __init__(self, decoder, lm_head, ids, mask, positions, row_prompt: torch.Tensor, softcap=None):
        self.decoder, self.lm_head, self.softcap = decoder, lm_head, softcap
        self.cache = GrowingCache()
        last = _prefill(decoder, lm_head, ids, mask, positions, self.cache, softcap)
        self.cache.batch_select_indices(row_prompt)
        self.first_logits = last[row_prompt]
        self.mask = mask[row_prompt]
        self.next_pos = positions[row_prompt, -1] + 1

    def keep(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]

    def step(self, tokens: torch.Tensor, lora: Optional[RowLora] = None) -> torch.Tensor:
        """One token a row; per-row LoRA (``lora``) is applied by the model's hooks
        (:class:`~.row_lora.RowLoraHooks`, which the caller activates), not here."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        out = self.decoder(input_ids=tokens.view(-1, 1), attention_mask=self.mask, position_ids=self.next_pos.view(-1, 1),
                           cache=self.cache, use_cache=True)
        self.next_pos = self.next_pos + 1
        return output_logits(self.lm_head, out.last_hidden_state[:, -1], self.softcap)


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
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < getattr(config, "max_position_embeddings", 0):
        return "sliding-window attention"
    if logit_softcap(config):
        return "soft-capped logits"
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if getattr(attn, "sliding_window", None) is not None:
            return "sliding-window attention"
        if (getattr(attn, "q_norm", None) is None) != (getattr(attn, "k_norm", None) is None):
            return "a norm on the queries or the keys only"
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
    qk_norm: bool = False  # Qwen3's per-head q_norm/k_norm
    index: int = 0  # its place in the decoder's layers (per-row LoRA's key, :mod:`.row_lora`)


class FusedWeights:
    """A Llama/Qwen2/Qwen3/Mistral causal LM with fused ``qkv`` and ``gate_up`` weights (see the module docstring)."""

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
        for index, layer in enumerate(self.decoder.layers):
            attn, mlp = layer.self_attn, layer.mlp
            projections = [attn.q_proj, attn.k_proj, attn.v_proj]
            wqkv, bqkv = _fuse(projections)
            wgu, _ = _fuse([mlp.gate_proj, mlp.up_proj])
            split = tuple(p.out_features for p in projections)
            qk_norm = getattr(attn, "q_norm", None) is not None
            self.layers.append(_Layer(layer, wqkv, bqkv, split, mlp.gate_proj.out_features, wgu, qk_norm, index))  # type: ignore[arg-type]

    def lora_layout(self) -> List[Tuple[str, dict]]:
        """Per layer: its path in the causal LM and its projections' output widths (what
        :class:`~.row_lora.PackedAdapter` stacks an adapter by)."""
        prefix = next(name for name, m in self.model.named_modules() if m is self.decoder.layers)
        out = []
        for layer in self.layers:
            q, k, v = layer.split
            o = layer.module.self_attn.o_proj.out_features
            down = layer.module.mlp.down_proj.out_features
            widths = {"q_proj": q, "k_proj": k, "v_proj": v, "o_proj": o, "gate_proj": layer.intermediate,
                      "up_proj": layer.intermediate, "down_proj": down}
            out.append((f"{prefix}.{layer.index}", widths))
        return out


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``[-sin_1, sin_2]`` (the halves of the last dimension), for :func:`_rotate`."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, as the models apply it: ``x cos + rotate_half(x) sin`` with
    ``rotate_half(x) = [-x_2, x_1]``, computed as ``x cos + [x_2, x_1] [-sin_1, sin_2]`` (the same
    products, so the same bits, in three operations instead of seven)."""
    d = x.shape[-1]
    swapped = x.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, signed_sin)


@dataclass
class _Block:
    """Prompts prefilled together: their keys/values once (``[P, kv, L, d]`` per layer, float32)
    and ``bias`` ``[P, L]`` (0, or -inf at left padding). ``group``/``slot``/``rows`` map the
    block's live rows (global row ids) into the ``[P, G]`` layout its attention runs in."""

    keys: List[torch.Tensor]
    values: List[torch.Tensor]
    bias: torch.Tensor
    group: torch.Tensor = None  # type: ignore[assignment]  # [P, G] row ids, padded with R
    slot: torch.Tensor = None  # type: ignore[assignment]  # [rows in block] places in P * G
    rows: torch.Tensor = None  # type: ignore[assignment]  # [rows in block] their row ids
    width: int = 0
    padded: bool = field(init=False)  # any -inf in ``bias`` (else attention runs without it)

    def __post_init__(self) -> None:
        self.padded = bool(torch.isinf(self.bias).any())

    def keep_prompts(self, keep: torch.Tensor) -> None:
        """Keep only the prompts ``keep`` (their keys, values and bias)."""
        self.keys, self.values = [k[keep] for k in self.keys], [v[keep] for v in self.values]
        self.bias = self.bias[keep]
        self.padded = bool(torch.isinf(self.bias).any())

    def attention_bias(self) -> Optional[torch.Tensor]:
        """``bias`` broadcastable over ``[P, kv, queries, L]``, or ``None`` with no left padding."""
        return self.bias[:, None, None, :] if self.padded else None


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor], scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(s) v, logsumexp(s))`` for ``s = q k^T scale + bias``: what two attention parts are
    merged from. ``q`` ``[B, H, Q, d]``, ``k``/``v`` ``[B, H, L, d]``, ``bias`` broadcastable to
    ``[B, H, Q, L]`` or ``None``; returns ``[B, H, Q, d]`` and ``[B, H, Q, 1]``.

    On the CPU this is one call of PyTorch's flash-attention kernel, which returns the log-sum-exp
    beside the output (a decode-sized attention then costs one operation instead of two small
    batched products and five reductions and element-wise passes); elsewhere the same formula in
    plain operations (also where a PyTorch build lacks the kernel)."""
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        out, lse = _CPU_FLASH(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
        return out, lse.unsqueeze(-1)
    s = torch.matmul(q * scale, k.transpose(-1, -2))
    if bias is not None:
        s = s + bias
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.matmul((s - lse).exp_(), v), lse


def _prompt_attention(block: _Block, i: int, padded: torch.Tensor, scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i`` attention of the block's rows to their prompts, one product per prompt for all
    its rows: ``(o, lse)`` ``[rows in block, kv, rep, d | 1]`` (normalised output, log-sum-exp of
    the scores). ``padded``: queries ``[R + 1, kv, rep, d]`` (row ``R`` is zeros, for the padded
    slots of ``block.group``)."""
    kp, vp = block.keys[i], block.values[i]
    prompts, width = kp.shape[0], block.width
    _, kv, rep, d = padded.shape
    qg = padded[block.group].transpose(1, 2).reshape(prompts, kv, width * rep, d)  # [P, kv, G*rep, d]
    out = []
    for t in attention_with_lse(qg, kp, vp, block.attention_bias(), scale):  # [P, kv, G*rep, x] -> rows
        x = t.shape[-1]
        out.append(t.view(prompts, kv, width, rep, x).transpose(1, 2).reshape(prompts * width, kv, rep, x)[block.slot])
    return out[0], out[1]


class FusedDecode:
    """Decode state of :class:`FusedWeights`: prompt blocks (each prompt's cache once), each
    row's own suffix (``[R, kv, cap, d]`` per layer, valid from the row's ``start`` column), and
    which block and prompt each row belongs to. Rows can :meth:`join` between steps (continuous
    batching): their prompts become a new block and their suffix starts at the current column."""

    can_join = True

    def __init__(self, fused: FusedWeights, ids, mask, positions, row_prompt: torch.Tensor):
        self.f = fused
        self.device = ids.device
        self.blocks: List[_Block] = []
        self.row_block: List[int] = []
        self.row_prompt: List[int] = []
        self.n = 0  # suffix columns written (shared by all rows)
        self.start = torch.zeros(0, dtype=torch.long, device=self.device)
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)
        shape = (0, fused.kv_heads, 64, fused.head_dim)
        self.suffix = [(torch.empty(shape, device=self.device), torch.empty(shape, device=self.device)) for _ in fused.layers]
        self.first_logits = self.join(ids, mask, positions, row_prompt)

    @property
    def rows(self) -> int:
        return len(self.row_block)

    def join(self, ids, mask, positions, row_prompt: torch.Tensor) -> torch.Tensor:
        """Prefill new prompts and add their rows (``row_prompt`` indexes ``ids``); returns the new
        rows' first logits ``[R_new, V]``."""
        from transformers import DynamicCache

        f = self.f
        cache = DynamicCache()
        last = _prefill(f.decoder, f.lm_head, ids, mask, positions, cache)
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=self.device).masked_fill_(mask == 0, float("-inf"))
        self.blocks.append(_Block([layer.keys.float() for layer in cache.layers], [layer.values.float() for layer in cache.layers], bias))
        added = row_prompt.shape[0]
        self.row_block += [len(self.blocks) - 1] * added
        self.row_prompt += row_prompt.tolist()
        self.start = torch.cat([self.start, torch.full((added,), self.n, dtype=torch.long, device=self.device)])
        self.next_pos = torch.cat([self.next_pos, positions[row_prompt, -1] + 1])
        self.suffix = [(torch.cat([k, k.new_zeros((added, *k.shape[1:]))]), torch.cat([v, v.new_zeros((added, *v.shape[1:]))]))
                       for k, v in self.suffix]
        self._regroup()
        return last[row_prompt]

    def _regroup(self) -> None:
        """Drop prompts (and blocks) with no live rows; rebuild each block's row layout."""
        used: dict = {}
        for b, p in zip(self.row_block, self.row_prompt):
            used.setdefault(b, set()).add(p)
        blocks, block_map, prompt_map = [], {}, {}
        for b, block in enumerate(self.blocks):
            if b not in used:
                continue
            prompts = sorted(used[b])
            if len(prompts) < block.bias.shape[0]:
                block.keep_prompts(torch.tensor(prompts, device=self.device))
            block_map[b] = len(blocks)
            prompt_map[b] = {p: i for i, p in enumerate(prompts)}
            blocks.append(block)
        self.row_prompt = [prompt_map[b][p] for b, p in zip(self.row_block, self.row_prompt)]
        self.row_block = [block_map[b] for b in self.row_block]
        self.blocks = blocks
        for b, block in enumerate(blocks):
            members: List[List[int]] = [[] for _ in range(block.bias.shape[0])]
            rows = [r for r, rb in enumerate(self.row_block) if rb == b]
            for r in rows:
                members[self.row_prompt[r]].append(r)
            width = max(len(m) for m in members)
            group = torch.full((len(members), width), self.rows, dtype=torch.long)
            for p, m in enumerate(members):
                group[p, : len(m)] = torch.tensor(m)
            block.group, block.width = group.to(self.device), width
            block.rows = torch.tensor(rows, device=self.device)
            block.slot = torch.tensor([self.row_prompt[r] * width + members[self.row_prompt[r]].index(r) for r in rows], device=self.device)
        self.identity = len(blocks) == 1 and self.row_prompt == list(range(self.rows))

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the rows ``index`` (in that order)."""
        kept = index.tolist()
        self.row_block = [self.row_block[r] for r in kept]
        self.row_prompt = [self.row_prompt[r] for r in kept]
        self.start, self.next_pos = self.start[index], self.next_pos[index]
        first = int(self.start.min()) if kept else 0  # columns no live row reads any more
        self.suffix = [(k[index, :, first:], v[index, :, first:]) for k, v in self.suffix]
        self.n -= first
        self.start -= first
        self._regroup()

    def merge_blocks(self) -> None:
        """Make the prompt blocks one: every block's keys, values and bias left-padded to the widest
        (the padding masked with -inf, as a one-pass prefill pads), prompts in the order of their
        first rows. A decode step then attends to every prompt in one call, as after one prefill
        pass (the sampler's prefill in parts, :meth:`.sampler.Sampler._prefill`)."""
        if len(self.blocks) < 2:
            return
        width = max(b.bias.shape[1] for b in self.blocks)
        offsets, total = [], 0
        for b in self.blocks:
            offsets.append(total)
            total += b.bias.shape[0]
        flat = [offsets[b] + p for b, p in zip(self.row_block, self.row_prompt)]
        order = list(dict.fromkeys(flat))  # prompts by their first row
        pick = torch.tensor(order, dtype=torch.long, device=self.device)
        left = [width - b.bias.shape[1] for b in self.blocks]
        keys = [torch.cat([F.pad(b.keys[i], (0, 0, pad, 0)) for b, pad in zip(self.blocks, left)])[pick] for i in range(len(self.f.layers))]
        values = [torch.cat([F.pad(b.values[i], (0, 0, pad, 0)) for b, pad in zip(self.blocks, left)])[pick] for i in range(len(self.f.layers))]
        bias = torch.cat([F.pad(b.bias, (pad, 0), value=float("-inf")) for b, pad in zip(self.blocks, left)])[pick]
        place = {p: i for i, p in enumerate(order)}
        self.blocks = [_Block(keys, values, bias)]
        self.row_prompt = [place[p] for p in flat]
        self.row_block = [0] * len(flat)
        self._regroup()

    def _grow(self) -> None:
        """Room for one more suffix column. :meth:`keep` cuts the columns no live row reads, so the
        capacity can reach 0 (every live row joined when the buffer was full): it then restarts at 64."""
        cap = self.suffix[0][0].shape[2]
        if self.n < cap:
            return
        new_cap = max(2 * cap, 64)
        grown = []
        for k, v in self.suffix:
            k2 = k.new_empty((k.shape[0], k.shape[1], new_cap, k.shape[-1]))
            v2 = v.new_empty((v.shape[0], v.shape[1], new_cap, v.shape[-1]))
            k2[:, :, : self.n], v2[:, :, : self.n] = k[:, :, : self.n], v[:, :, : self.n]
            grown.append((k2, v2))
        self.suffix = grown

    def _suffix_bias(self, n: int) -> Optional[torch.Tensor]:
        """``[R, n]``: -inf at columns before a row's start (rows that joined later), or ``None``."""
        if not bool((self.start > 0).any()):
            return None
        columns = torch.arange(n, device=self.device)
        return torch.zeros((self.rows, n), device=self.device).masked_fill_(columns[None] < self.start[:, None], float("-inf"))

    def _attend(self, i: int, q: torch.Tensor, n: int, suffix_bias: Optional[torch.Tensor]) -> torch.Tensor:
        """Layer ``i``: queries ``q`` ``[R, heads, d]`` (rotated) against the rows' prompts and the
        first ``n`` columns of their suffixes (``suffix_bias`` ``[R, n]`` masks columns before a
        row's start); ``[R, heads * d]`` in float32. The two parts merge by their log-sum-exps,
        ``out = o_s + (o_p - o_s) sigmoid(lse_p - lse_s)``: the module docstring's formula, since
        ``e^{m_p} l_p = e^{lse_p}``."""
        f = self.f
        rows, kv, rep, d = q.shape[0], f.kv_heads, f.heads // f.kv_heads, f.head_dim
        q = q.float().view(rows, kv, rep, d)
        if self.identity:  # row r is prompt r's only row: the prompts' batch is the rows' batch
            block = self.blocks[0]
            parts = [(block.rows, *attention_with_lse(q, block.keys[i], block.values[i], block.attention_bias(), f.scale))]
        else:
            padded = torch.cat([q, q.new_zeros((1, kv, rep, d))])
            parts = [(block.rows, *_prompt_attention(block, i, padded, f.scale)) for block in self.blocks]
        if len(parts) == 1:
            _, op, lp = parts[0]  # every row, in row order
        else:
            op, lp = q.new_empty((rows, kv, rep, d)), q.new_empty((rows, kv, rep, 1))
            for index, o_, l_ in parts:
                op[index], lp[index] = o_, l_
        ks, vs = self.suffix[i]
        bias = suffix_bias[:, None, None, :] if suffix_bias is not None else None
        os_, ls = attention_with_lse(q, ks[:, :, :n], vs[:, :, :n], bias, f.scale)
        return torch.lerp(os_, op, torch.sigmoid(lp - ls)).view(rows, kv * rep * d)

    def step(self, tokens: torch.Tensor, lora: Optional[RowLora] = None) -> torch.Tensor:
        """One token a row; ``lora`` routes each row to its adapter (:mod:`.row_lora`; ``None``:
        the weights as they are, merged or base)."""
        f = self.f
        self._grow()
        x = f.decoder.embed_tokens(tokens)  # [R, hidden]
        cos, sin = f.decoder.rotary_emb(x[:, None], self.next_pos[:, None])  # [R, 1, d]
        sin = _signed_sin(sin)
        s = self.n
        suffix_bias = self._suffix_bias(s + 1)
        for i, layer in enumerate(f.layers):
            q, k, v = step_qkv(f, layer, x, cos, sin, lora)
            ks, vs = self.suffix[i]
            ks[:, :, s] = k
            vs[:, :, s] = v
            attn = self._attend(i, q, s + 1, suffix_bias).to(x.dtype)
            x = step_rest(f, layer, x, attn, lora)
        self.n = s + 1
        self.next_pos = self.next_pos + 1
        return f.linear(f.decoder.norm(x), f.lm_head.weight, f.lm_head.bias).float()


def step_qkv(f: "FusedWeights", layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             lora: Optional[RowLora] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step's attention inputs for ``x`` ``[R, hidden]`` (one new token a row): the input
    norm, the fused q/k/v product (plus each row's adapter's, with ``lora``), Qwen3's per-head
    RMSNorm of q and k where the layer has it, the rotation; ``q`` ``[R, heads, d]``, ``k`` and
    ``v`` ``[R, kv_heads, d]``."""
    module, rows = layer.module, x.shape[0]
    h = module.input_layernorm(x)
    qkv = f.linear(h, layer.wqkv, layer.bqkv)
    if lora is not None:
        lora.add_site(qkv, h, layer.index, "qkv")
    nq, nk, _ = layer.split
    qk = qkv[:, : nq + nk].view(rows, f.heads + f.kv_heads, f.head_dim)
    if layer.qk_norm:  # Qwen3: RMSNorm over each head's queries and keys, before the rotation
        attn_mod = module.self_attn
        qk = torch.cat([attn_mod.q_norm(qk[:, : f.heads]), attn_mod.k_norm(qk[:, f.heads :])], dim=1)
    qk = _rotate(qk, cos, sin)
    return qk[:, : f.heads], qk[:, f.heads :], qkv[:, nq + nk :].view(rows, f.kv_heads, f.head_dim)


def step_rest(f: "FusedWeights", layer: Any, x: torch.Tensor, attn: torch.Tensor, lora: Optional[RowLora] = None) -> torch.Tensor:
    """The rest of one decode step's layer: ``x + o_proj(attn)``, then the gated MLP's residual
    (with ``lora``, each of the three products plus each row's adapter's)."""
    module = layer.module
    o_proj, down = module.self_attn.o_proj, module.mlp.down_proj
    o = f.linear(attn, o_proj.weight, o_proj.bias)
    if lora is not None:
        lora.add_site(o, attn, layer.index, "o")
    x = x + o
    h = module.post_attention_layernorm(x)
    gu = f.linear(h, layer.wgu)
    if lora is not None:
        lora.add_site(gu, h, layer.index, "gate_up")
    gate, up = gu.split(layer.intermediate, dim=-1)
    act = module.mlp.act_fn(gate) * up
    down_out = f.linear(act, down.weight, down.bias)
    if lora is not None:
        lora.add_site(down_out, act, layer.index, "down")
    return x + down_out


def start_decode(model_or_fused, ids, mask, positions, row_prompt: torch.Tensor):
    """Prefill and return the decode state (``.first_logits`` ``[R, V]``, ``.step``, ``.keep``,
    and ``.join`` where ``.can_join``)."""
    if isinstance(model_or_fused, FusedWeights):
        return FusedDecode(model_or_fused, ids, mask, positions, row_prompt)
    decoder, lm_head = model_or_fused.get_decoder(), model_or_fused.get_output_embeddings()
    return HFDecode(decoder, lm_head, ids, mask, positions, row_prompt, logit_softcap(model_or_fused.config))
