"""A group too big for one micro-batch, with its shared prompt run once.

A shared-prefix unit (:mod:`.batching`) of ``G`` completions of one ``p``-token prompt costs
``p + G * s`` padded tokens (``s`` its longest completion). When that is over
``micro_batch_tokens`` its rows are cut into parts of ``r`` rows. Running every part as a unit of
its own would run the prompt — forward, backward and its saved activations — once per part
(measured with 600-token GSM8K prompts at a 1024-token budget: 66 s against 36 s for the
unsplit step). Here the prompt runs once and its outputs are cut out of the autograd graph:

    h, K_l, V_l  = prompt(x)                       once, with autograd (h: the prompt's last
                                                   hidden states; K_l, V_l: layer l's cache)
    h*, K*, V*   = detached copies that require grad
    for each part j:  L_j(suffix_j(K*, V*), h*) .backward()   # LoRA grads from the part, and
                                                              # dL_j/dh*, dL_j/dK*, dL_j/dV* add up
    backward([h, K, V], grad=[h*.grad, K*.grad, V*.grad])     # one pass through the prompt

The loss is datum-separable (every loss that is micro-batched is), so ``L = sum_j L_j`` and by the
chain rule ``dL/dtheta = sum_j dL_j/dtheta|suffix + (sum_j dL_j/d(h, K, V)) d(h, K, V)/dtheta``:
the same gradient as one unsplit pass, up to float summation order. Memory holds the prompt's
activations once plus one part's; compute runs the prompt forward and backward once.

The prompt positions' own logprobs (the targets of positions ``0 .. p-2`` are shared by every
member; the last position's target is each member's first completion token) are computed once
from ``h`` and cut out the same way. Forward-only passes (``forward``, scoring) run the same
layout without gradients.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from rlkit.backends.local import activations
from rlkit.backends.local.batching import Unit, right_padded
from rlkit.losses.base import Loss, datum_input
from rlkit.types import Datum

Logprobs = Callable[..., torch.Tensor]  # target_logprobs(hidden, weight, targets, temperature, *, bias, compute_dtype)


def _cut(t: torch.Tensor, backward: bool) -> torch.Tensor:
    """``t`` as a new leaf of the graph (gradients collect in ``.grad``)."""
    return t.detach().requires_grad_(backward)


def run_split_unit(engine: Any, data: Sequence[Datum], unit: Unit, loss: Loss, *, backward: bool,
                   layers: int, on_part: Callable[[Dict[str, float]], None]) -> List[torch.Tensor]:
    """Forward (and backward) ``loss`` over ``unit`` (indices into ``data``) in parts of
    ``unit.rows_per_part`` rows, running its prompt once (see the module docstring). ``on_part`` gets
    each part's loss metrics; returns each member's logprobs, in ``unit.indices`` order."""
    from transformers import DynamicCache

    p = unit.prefix_len
    dev = engine.device
    config = engine.causal_lm.config
    logprobs_fn: Logprobs = engine.logprobs_fn
    first = data[unit.indices[0]]
    prompt_ids = torch.tensor(first.model_input.to_ints()[:p], dtype=torch.long).unsqueeze(0)
    out: List[torch.Tensor] = []

    def inputs(d: Datum, start: int, end: int) -> Tuple[torch.Tensor, torch.Tensor]:
        target = datum_input(d, "target_tokens", dtype=torch.long)[start:end]
        temps = datum_input(d, "temperature")[start:end] if "temperature" in d.loss_fn_inputs else torch.ones(end - start)
        return target, temps

    with torch.set_grad_enabled(backward), engine._autocast():
        cache = DynamicCache(config=config)  # every layer's entry exists before it runs (checkpointing)
        with activations.checkpointing(layers, keep_cache=True):
            hidden = engine.decoder(input_ids=prompt_ids.to(dev), position_ids=torch.arange(p, device=dev).unsqueeze(0),
                                    cache=cache, use_cache=True).last_hidden_state[0]  # [p, d]
        keys = [entry.keys for entry in cache.layers]
        values = [entry.values for entry in cache.layers]
        target, temps = inputs(first, 0, p - 1)
        shared_lp = logprobs_fn(hidden[:-1], engine.lm_head.weight, target, temps, bias=engine.lm_head.bias,
                                compute_dtype=engine.compute_dtype)
    cut_lp, cut_last = _cut(shared_lp, backward), _cut(hidden[-1:], backward)
    cut_keys = [_cut(k, backward) for k in keys]
    cut_values = [_cut(v, backward) for v in values]

    for start in range(0, len(unit.indices), unit.rows_per_part):
        members = unit.indices[start : start + unit.rows_per_part]
        part = [data[i] for i in members]
        with torch.set_grad_enabled(backward), engine._autocast():
            suffixes = [d.model_input.to_ints()[p:] for d in part]
            ids, suffix_mask = right_padded(suffixes, engine.pad_id)
            width = ids.shape[1]
            mask = torch.cat([torch.ones((len(part), p), dtype=torch.long), suffix_mask], dim=1)  # the prompt, then each suffix
            part_cache = DynamicCache(config=config)
            for layer, (k, v) in enumerate(zip(cut_keys, cut_values)):
                part_cache.update(k.expand(len(part), *k.shape[1:]), v.expand(len(part), *v.shape[1:]), layer)
            positions = (p + torch.arange(width)).unsqueeze(0).expand(len(part), width)
            with activations.checkpointing(layers, keep_cache=False):
                suffix_hidden = engine.decoder(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                                               cache=part_cache, use_cache=True).last_hidden_state
            rows, targets, temperatures = [], [], []
            for r, (d, s) in enumerate(zip(part, suffixes)):  # the prompt's last position, then the completion
                rows += [cut_last, suffix_hidden[r, : len(s)]]
                t, tt = inputs(d, p - 1, p + len(s))
                targets.append(t)
                temperatures.append(tt)
            own = logprobs_fn(torch.cat(rows), engine.lm_head.weight, torch.cat(targets), torch.cat(temperatures),
                              bias=engine.lm_head.bias, compute_dtype=engine.compute_dtype).cpu()
            pieces = torch.split(own, [1 + len(s) for s in suffixes])
            part_lp = [torch.cat([cut_lp.cpu(), piece]) for piece in pieces]
            value, metrics = loss(part, part_lp)
            if backward:
                engine.backward(value, loss)
        on_part(metrics)
        out += [lp.detach() for lp in part_lp]
    if backward:
        _backward_through_prompt([shared_lp, hidden[-1:], *keys, *values], [cut_lp, cut_last, *cut_keys, *cut_values])
    return out


def _backward_through_prompt(outputs: List[torch.Tensor], cuts: List[torch.Tensor]) -> None:
    """One backward pass through the prompt, seeded with what every part sent back to its outputs."""
    pairs: List[Tuple[torch.Tensor, Optional[torch.Tensor]]] = [
        (o, c.grad) for o, c in zip(outputs, cuts) if c.grad is not None and o.requires_grad
    ]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
