"""Activation memory of the local engine's forward/backward: per-layer activation checkpointing.

A decoder layer run under checkpointing keeps only its input hidden states for backward and
recomputes the rest when the backward pass reaches it (:func:`torch.utils.checkpoint.checkpoint`,
non-reentrant): for SmolLM2-135M a layer's ~47 KB of saved activations per token become its
2.3 KB input, at the price of one more forward pass of the checkpointed layers.
Gradients are unchanged (the recomputation is the same arithmetic).

``backend.activation_checkpointing``:

- ``false``: never; ``true``: every decoder layer;
- ``auto`` (default): per micro-batch, as many layers as it takes for the estimated saved
  activations to fit :func:`auto_budget`, which is set by the **memory there is**, not by a rule
  of thumb: :data:`AUTO_FRACTION` of the memory available now (host memory
  ``psutil.virtual_memory().available`` on the CPU, ``torch.cuda.mem_get_info`` plus the
  allocator's free cache on a GPU), less the micro-batch's working memory
  (:func:`working_bytes`). When the unchecked step fits with that margin it runs unchecked (the
  fastest: checkpointing costs one more forward of the checkpointed layers, measured +6-31 % step
  time on CPU for all 30 layers of SmolLM2).
- ``auto`` under a **memory limit** (``backend.memory_limit_gb`` / ``connect("local",
  memory_limit_gb=...)``: :class:`Within`): the budget is also at most the limit less what the
  process holds without activations (:func:`resident_floor`: its resident memory — RSS on the CPU,
  ``torch.cuda.memory_allocated`` on a GPU — when the model first trains, plus the gradients and
  Adam moments of its trainable parameters) and less the working memory, the estimates taken
  :data:`LIMIT_MARGIN` larger, so the step's peak stays under the limit while checkpointing only
  the layers it must. The limit bounds the training
  step; a sampler decoding at the same moment adds its key/value cache on top.

The estimate (:func:`saved_bytes_per_token_layer`) is ``(10 * hidden + 4 * intermediate) * 4``
bytes per token per layer — the tensors a Llama-style layer with LoRA saves (norms, q/k/v/o inputs
and outputs, residuals; gate, up, activation and product of the MLP), at 4 bytes (fp32; bf16
autocast keeps some fp32 copies too, so the same figure is used); it gives 1.43 MB a token for
SmolLM2-135M, measured 1.35 MB. A checkpointed layer keeps ``hidden * 4`` bytes a token. So with
``T`` padded tokens, ``L`` layers, ``b`` bytes per token per layer and budget ``B``:
``k = ceil((T*L*b - B) / (T*(b - 4*hidden)))`` layers, clamped to ``[0, L]`` (0 when ``T*L*b <= B``).

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
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from rlkit.backends.local.logprobs import CHUNK_ROWS
from rlkit.errors import InvalidInputError

AUTO_FRACTION = 0.5  # auto: a micro-batch's saved activations and working memory may take this share of free memory
#: under a limit the estimates are taken this much larger (a margin for what they leave out: the
#: allocator's rounding, small tensors); measured on the GSM8K-shaped RL step they were within 5 %
LIMIT_MARGIN = 1.1


@dataclass(frozen=True)
class Within:
    """``auto`` under a memory limit: the training step's peak stays under ``limit_bytes``."""

    limit_bytes: int


Mode = Union[bool, str, Within]
_FLOORS: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()


def check_mode(value: Any, memory_limit_gb: Optional[float] = None) -> Mode:
    """``True`` / ``False`` / ``"auto"`` from a Python value or a config string, or :class:`Within`
    for ``auto`` under ``memory_limit_gb`` (one-line errors)."""
    if isinstance(value, Within) or isinstance(value, bool):
        mode: Mode = value
    else:
        text = str(value).strip().lower()
        if text in ("true", "on", "yes", "1"):
            mode = True
        elif text in ("false", "off", "no", "0", "none"):
            mode = False
        elif text == "auto":
            mode = "auto"
        else:
            raise InvalidInputError(f"activation_checkpointing={value!r}: expected false, true or auto")
    if memory_limit_gb is None:
        return mode
    try:
        limit = float(memory_limit_gb)
    except (TypeError, ValueError):
        limit = math.nan
    if not limit > 0 or math.isinf(limit):
        raise InvalidInputError(f"memory_limit_gb={memory_limit_gb!r}: expected a size in GB > 0 (or null for no limit)")
    if mode != "auto":
        raise InvalidInputError(f"memory_limit_gb={memory_limit_gb}: it guides activation_checkpointing=auto, and this "
                                f"session's is {mode!r}; set activation_checkpointing=auto or leave the limit unset")
    return Within(int(limit * 2**30))


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


def working_bytes(tokens: int, config: Any) -> int:
    """Memory a micro-batch of ``tokens`` needs besides what it saves for backward: the output
    layer's chunk of rows (:mod:`.logprobs`: logits, their exponentials and the expectation's
    product, three ``[rows, V]`` float32 tensors at most), one layer's attention scores and
    weights while it runs (``2 * heads * tokens^2`` float32 values: at most, all tokens in one packed
    row; measured, this term was the 0.28 GiB the estimate missed on 2048-token packed micro-batches
    of SmolLM2) and two layers' worth of activations (a checkpointed layer recomputed in backward,
    the gradients flowing through it)."""
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    tokens = int(tokens)
    return (3 * min(tokens, CHUNK_ROWS) * vocab * 4 + 2 * heads * tokens * tokens * 4
            + 2 * tokens * saved_bytes_per_token_layer(config))


def resident_floor(model: torch.nn.Module, device: torch.device) -> int:
    """What the process holds without activations, for a limit (:class:`Within`): its resident
    memory (:func:`resident_bytes`) the first time ``model`` trains, before any activation exists
    (later readings include freed memory the allocator keeps for reuse), plus the gradients and two
    Adam moments of its trainable parameters (float32), which do not exist yet then."""
    floor = _FLOORS.get(model)
    if floor is None:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        floor = _FLOORS[model] = resident_bytes(device) + 3 * 4 * trainable
    return floor


def auto_budget(mode: Mode, tokens: int, config: Any, device: torch.device, model: torch.nn.Module) -> float:
    """Bytes a micro-batch's saved activations may take under ``auto``:
    ``AUTO_FRACTION * available_memory(device) - working_bytes``, and under a limit at most
    ``(limit - resident_floor) / LIMIT_MARGIN - working_bytes`` (negative: checkpoint every layer)."""
    working = working_bytes(tokens, config)
    budget = AUTO_FRACTION * available_memory(device) - working
    if isinstance(mode, Within):
        budget = min(budget, (mode.limit_bytes - resident_floor(model, device)) / LIMIT_MARGIN - working)
    return budget


def layers_for(mode: Mode, tokens: int, n_layers: int, config: Any, device: torch.device, model: torch.nn.Module) -> int:
    """Decoder layers to checkpoint for a micro-batch of ``tokens`` padded tokens: all for ``true``,
    none for ``false`` (or a model without per-layer checkpointing, ``n_layers == 0``), and for
    ``auto`` (or :class:`Within`) :func:`layers_to_checkpoint` under :func:`auto_budget`, a
    checkpointed layer keeping its ``4 * hidden`` bytes of input a token."""
    if mode is False or not n_layers:
        return 0
    if mode is True:
        return n_layers
    kept = 4 * int(config.hidden_size)
    budget = auto_budget(mode, tokens, config, device, model)
    return layers_to_checkpoint(tokens, n_layers, saved_bytes_per_token_layer(config), kept, budget)


def available_memory(device: torch.device) -> int:
    """Bytes that can still be allocated on ``device`` now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.virtual_memory().available)


def resident_bytes(device: torch.device) -> int:
    """Bytes this process holds on ``device`` now: tensors allocated on a GPU, resident memory on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.Process().memory_info().rss)


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
