"""Activation memory of the local engine's forward/backward: per-layer activation checkpointing.

A decoder layer run under checkpointing keeps only its input hidden states for backward and
recomputes the rest when the backward pass reaches it (:func:`torch.utils.checkpoint.checkpoint`,
non-reentrant): for SmolLM2-135M a layer's ~47 KB of saved activations per token become its
2.3 KB input, at the price of one more forward pass of the checkpointed layers.
Gradients are unchanged (the recomputation is the same arithmetic).

``backend.activation_checkpointing``:

- ``false``: never; ``true``: every decoder layer;
- ``auto`` (default): per micro-batch, as many layers as it takes for the estimated saved
  activations to fit the budget of :func:`auto_budget`: the smaller of :data:`AUTO_FRACTION` of the
  memory available now (host memory ``psutil.virtual_memory().available`` on the CPU,
  ``torch.cuda.mem_get_info`` plus the allocator's free cache on a GPU) and
  :data:`ACTIVATIONS_PER_WEIGHT` times the bytes of the model's own weights (times the runs whose
  rows share the micro-batch, in a fused pass of several LoRA runs: each keeps its own allowance,
  so runs of equal size fused checkpoint the layers each would alone). The second bound
  keeps a step's peak in proportion to what the run must hold anyway: activations beyond the
  weights' size are cheap to recompute (at most one more forward of the checkpointed layers;
  measured +6-31 % step time on CPU for all 30 layers of SmolLM2) and expensive to keep (they set
  the process's peak — the memory other runs, the sampler's KV cache and vLLM need). On a
  GSM8K-shaped RL batch (64 rows, 2048-token micro-batches) this checkpoints most layers of
  SmolLM2-135M; a 8B model in bf16 keeps up to 16 GB of activations before checkpointing. The estimate (:func:`saved_bytes_per_token_layer`) is
  ``(10 * hidden + 4 * intermediate) * 4`` bytes per token per layer — the tensors a Llama-style
  layer with LoRA saves (norms, q/k/v/o inputs and outputs, residuals; gate, up, activation and
  product of the MLP), at 4 bytes (fp32; bf16 autocast keeps some fp32 copies too, so the same
  figure is used); it gives 1.43 MB a token for SmolLM2-135M, measured 1.35 MB. A checkpointed
  layer keeps ``hidden * 4`` bytes a token. So with ``T`` padded tokens, ``L`` layers, ``b`` bytes
  per token per layer and budget ``B``: ``k = ceil((T*L*b - B) / (T*(b - 4*hidden)))`` layers,
  clamped to ``[0, L]`` (0 when ``T*L*b <= B``).

The engine's shared-prompt layout runs a prompt through the decoder with a key/value cache and
then the completions against it. A layer that writes the cache cannot simply be replayed (the
replay would append its keys a second time), which is why Hugging Face's own
``gradient_checkpointing_enable`` turns the cache off. Here the wrapper remembers the layer's
cache entry as it was before the layer ran and puts it back before the replay, so the replay
appends exactly what the first run did; in the last pass (``keep_cache=False``) the entry is
put back right after the layer runs, so the grown copy is not kept for backward.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from rlkit.errors import InvalidInputError

AUTO_FRACTION = 0.25  # auto: the saved activations of one micro-batch may take this share of free memory
ACTIVATIONS_PER_WEIGHT = 1.0  # auto: ... and at most this many times the bytes of the model's weights

Mode = Union[bool, str]


def check_mode(value: Any) -> Mode:
    """``True`` / ``False`` / ``"auto"`` from a Python value or a config string (one-line error)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "on", "yes", "1"):
        return True
    if text in ("false", "off", "no", "0", "none"):
        return False
    if text == "auto":
        return "auto"
    raise InvalidInputError(f"activation_checkpointing={value!r}: expected false, true or auto")


def saved_bytes_per_token_layer(config: Any) -> int:
    """Estimated bytes one decoder layer saves for backward per token (see the module docstring)."""
    hidden = int(config.hidden_size)
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    return (10 * hidden + 4 * intermediate) * 4


def layers_to_checkpoint(tokens: int, n_layers: int, per_token_layer: int, kept_per_token_layer: int, budget: float) -> int:
    """How many of ``n_layers`` to checkpoint so ``tokens`` tokens' saved activations fit ``budget``
    bytes: ``ceil((tokens * n_layers * b - budget) / (tokens * (b - kept)))``, in ``[0, n_layers]``."""
    need = tokens * n_layers * per_token_layer
    if need <= budget:
        return 0
    saved_per_layer = tokens * max(per_token_layer - kept_per_token_layer, 1)
    return min(n_layers, math.ceil((need - budget) / saved_per_layer))


def auto_budget(device: torch.device, model: torch.nn.Module, runs: int = 1) -> float:
    """Bytes a micro-batch's saved activations may take under ``auto``:
    ``min(AUTO_FRACTION * available_memory(device), runs * ACTIVATIONS_PER_WEIGHT * weight_bytes(model))``.
    ``runs``: the training runs whose rows share the micro-batch (a fused pass of several LoRA runs,
    :mod:`.multi_lora`): each brings the allowance it has alone, so fusing runs does not make any of
    them recompute layers it would have kept alone; the free-memory bound stays one for the process."""
    return min(AUTO_FRACTION * available_memory(device), max(int(runs), 1) * ACTIVATIONS_PER_WEIGHT * weight_bytes(model))


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters (each counted once, however many modules share it)."""
    seen = {}
    for p in model.parameters():
        seen[id(p)] = p.numel() * p.element_size()
    return sum(seen.values())


def layers_for(mode: Mode, tokens: int, n_layers: int, config: Any, device: torch.device, model: torch.nn.Module,
               runs: int = 1) -> int:
    """Decoder layers to checkpoint for a micro-batch of ``tokens`` padded tokens (rows of ``runs``
    training runs): all for ``true``, none for ``false`` (or a model without per-layer
    checkpointing, ``n_layers == 0``), and for ``auto`` :func:`layers_to_checkpoint` under
    :func:`auto_budget`, a checkpointed layer keeping its ``4 * hidden`` bytes of input a token."""
    if mode is False or not n_layers:
        return 0
    if mode is True:
        return n_layers
    kept = 4 * int(config.hidden_size)
    return layers_to_checkpoint(tokens, n_layers, saved_bytes_per_token_layer(config), kept, auto_budget(device, model, runs))


def available_memory(device: torch.device) -> int:
    """Bytes that can still be allocated on ``device`` now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.virtual_memory().available)


# -- the per-layer wrapper ------------------------------------------------------------------------


@dataclass
class _Plan:
    layers: int  # layers with index < layers are checkpointed
    keep_cache: bool = True  # False: restore each layer's cache entry right after it runs


_local = threading.local()


@contextlib.contextmanager
def checkpointing(layers: int, *, keep_cache: bool = True):
    """Within this block, on this thread, decoder layers ``0 .. layers-1`` wrapped by
    :func:`install` run checkpointed (nothing changes with ``layers == 0``)."""
    previous = getattr(_local, "plan", None)
    _local.plan = _Plan(int(layers), keep_cache) if layers > 0 else None
    try:
        yield
    finally:
        _local.plan = previous


class CheckpointedForward:
    """A decoder layer's instance ``forward``: the class's forward, checkpointed inside
    :func:`checkpointing` (on the calling thread only: a sampler sharing the layer is unaffected).
    Holds the layer as an attribute, so ``copy.deepcopy`` of a model rebinds it to the copy."""

    def __init__(self, layer: torch.nn.Module, index: int):
        self.layer = layer
        self.index = index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        layer = self.layer
        forward = type(layer).forward
        plan: Optional[_Plan] = getattr(_local, "plan", None)
        if plan is None or self.index >= plan.layers or not torch.is_grad_enabled() or not layer.training:
            return forward(layer, *args, **kwargs)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        entry = None
        if cache is not None:
            entries = getattr(cache, "layers", None)
            if entries is None or len(entries) <= self.index:  # an entry created by this call cannot be replayed
                return forward(layer, *args, **kwargs)
            entry = entries[self.index]
        before = dict(entry.__dict__) if entry is not None else None

        def run(*inputs: Any) -> Any:
            if entry is not None:  # the replay sees the cache entry the first run saw
                entry.__dict__.clear()
                entry.__dict__.update(before)
            return forward(layer, *inputs, **kwargs)

        out = torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False)
        if entry is not None and not plan.keep_cache:
            entry.__dict__.clear()
            entry.__dict__.update(before)
        return out


def install(layers: torch.nn.ModuleList) -> None:
    """Wrap every decoder layer's ``forward`` (idempotent)."""
    for i, layer in enumerate(layers):
        if not isinstance(layer.__dict__.get("forward"), CheckpointedForward):
            layer.forward = CheckpointedForward(layer, i)
