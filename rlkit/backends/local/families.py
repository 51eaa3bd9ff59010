"""What the local backend knows per model family, and tiny random-weight models of each.

Families covered (each tested on the CPU at tiny dimensions against the model's own forward,
``tests/backends/test_local_families.py``):

==============  ==================  ==============================================  ===============
family          ``model_type``      LoRA targets (``LoraSpec`` defaults)             sampler decode
==============  ==================  ==============================================  ===============
Llama 3.x       ``llama``           q/k/v/o, gate/up/down                            lean (fused)
Qwen2.5         ``qwen2``           q/k/v/o (+ their biases frozen), gate/up/down    lean (fused)
Qwen3           ``qwen3``           q/k/v/o, gate/up/down (q/k RMSNorm frozen)       lean (fused)
Mistral         ``mistral``         q/k/v/o, gate/up/down                            lean when no sliding
                                                                                     window is shorter than
                                                                                     the context, else own
Gemma 2         ``gemma2``          q/k/v/o, gate/up/down                            the model's own forward
Gemma 3 (text)  ``gemma3_text``     q/k/v/o, gate/up/down                            the model's own forward
Qwen3-MoE       ``qwen3_moe``       q/k/v/o only: the experts are fused 3-D          the model's own forward
                                    parameters (not ``nn.Linear``) and stay frozen
GPT-OSS         ``gpt_oss``         q/k/v/o only (experts frozen, as Qwen3-MoE)      the model's own forward
==============  ==================  ==============================================  ===============

Gemma 2's final logit soft-capping (``logits = c * tanh(logits / c)``, ``c = 30``) is applied
wherever rlkit computes logits itself: the sampler's output layer (:func:`output_logits`) and the
trainer's target logprobs (:func:`softcapped_target_logprobs`), so both match the model's forward.

``load_model("tiny-<family>")`` builds one of :data:`TINY_FAMILIES`: that family's real
architecture (its config class, attention and norm layout, rotary variant, soft-caps, sliding
windows, attention sinks, experts) at hidden size 64, two layers and the tiny test tokenizer's 512-token vocabulary,
from a fixed seed (every build identical).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional

import torch

from rlkit.backends.local.device import seeded_global_rng

#: shared tiny dimensions: 4 query heads of 16 over 2 key/value heads (grouped-query attention)
_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512)


def _llama(**ids: Any):
    from transformers import LlamaConfig

    # Llama 3.1's rotary scaling ("llama3"), scaled down with the context
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    return LlamaConfig(**_DIMS, rope_scaling=rope, tie_word_embeddings=False, **ids)


def _qwen2(**ids: Any):
    from transformers import Qwen2Config

    return Qwen2Config(**_DIMS, rope_theta=1000000.0, tie_word_embeddings=True, **ids)  # q/k/v biases, as Qwen2.5


def _qwen3(**ids: Any):
    from transformers import Qwen3Config

    return Qwen3Config(**_DIMS, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=True, **ids)


def _mistral(**ids: Any):
    from transformers import MistralConfig

    return MistralConfig(**_DIMS, sliding_window=None, tie_word_embeddings=False, **ids)  # Mistral v0.3: no window


def _gemma2(**ids: Any):
    from transformers import Gemma2Config

    # soft-capped attention (50) and logits (30), alternating sliding (8 tokens here) / global layers
    return Gemma2Config(**_DIMS, head_dim=16, sliding_window=8, query_pre_attn_scalar=16, **ids)


def _gemma3(**ids: Any):
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**_DIMS, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                            layer_types=["sliding_attention", "full_attention"], **ids)


def _qwen3_moe(**ids: Any):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**_DIMS, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          decoder_sparse_step=1, tie_word_embeddings=False, **ids)


def _gpt_oss(**ids: Any):
    from transformers import GptOssConfig

    # attention sinks, alternating sliding (8 here) / full layers, YaRN rotary, 4 experts with biases
    return GptOssConfig(**_DIMS, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False, **ids)


TINY_FAMILIES: Dict[str, Callable[..., Any]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mistral": _mistral,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "qwen3-moe": _qwen3_moe,
    "gpt-oss": _gpt_oss,
}
TINY_PREFIX = "tiny-"


def tiny_family(name: str) -> Optional[str]:
    """``"qwen3"`` for ``"tiny-qwen3"``; ``None`` for a name that is not a tiny family."""
    if name.startswith(TINY_PREFIX) and name[len(TINY_PREFIX):] in TINY_FAMILIES:
        return name[len(TINY_PREFIX):]
    return None


def build_tiny_family(family: str, tokenizer: Any, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random-weight causal LM of ``family``'s architecture at tiny dimensions (fixed seed)."""
    from transformers import AutoModelForCausalLM

    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    config = TINY_FAMILIES[family](**ids)
    with seeded_global_rng(1234):
        model = AutoModelForCausalLM.from_config(config)
    return model.to(dtype)


# -- output layer ----------------------------------------------------------------------------------


def logit_softcap(config: Any) -> Optional[float]:
    """The final logit soft-cap of ``config`` (Gemma 2: 30.0), or ``None``."""
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None


def output_logits(lm_head: torch.nn.Module, hidden: torch.Tensor, softcap: Optional[float]) -> torch.Tensor:
    """float32 logits of ``hidden`` as the model's own forward makes them (soft-capped if it does)."""
    logits = lm_head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def target_logprobs_for(config: Any) -> Callable[..., torch.Tensor]:
    """The trainer's target-logprob function for a model of ``config``: :func:`.logprobs.target_logprobs`
    (closed-form backward), or :func:`softcapped_target_logprobs` where the logits are soft-capped."""
    from rlkit.backends.local.logprobs import target_logprobs

    cap = logit_softcap(config)
    return target_logprobs if cap is None else functools.partial(softcapped_target_logprobs, softcap=cap)


def softcapped_target_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               temperature: Optional[torch.Tensor] = None, *, softcap: float,
                               bias: Optional[torch.Tensor] = None, compute_dtype: Optional[torch.dtype] = None,
                               chunk_rows: int = 1024) -> torch.Tensor:
    """``log softmax(c tanh((W h + b) / c) / T)[y]`` per row, in row chunks (Gemma 2's output layer).

    The soft-cap changes the gradient (``1 - tanh^2``), so the closed-form backward of
    :mod:`.logprobs` does not apply; each chunk is recomputed in the backward pass instead
    (activation checkpointing), so no chunk's ``[rows, V]`` logits outlive it."""
    from torch.utils.checkpoint import checkpoint

    dtype = compute_dtype or hidden.dtype
    w = weight.detach()
    b = None if bias is None else bias.detach().float()
    targets = targets.to(device=hidden.device, dtype=torch.long)
    inv = (torch.ones(hidden.shape[0], device=hidden.device) if temperature is None
           else 1.0 / temperature.to(device=hidden.device, dtype=torch.float32))

    def chunk(h: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = (h.to(dtype) @ w.to(dtype).T).float()
        if b is not None:
            logits = logits + b
        z = torch.tanh(logits / softcap) * softcap * t.unsqueeze(-1)
        return z.gather(-1, y.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)

    parts = []
    with torch.autocast(hidden.device.type, enabled=False):
        for s in range(0, hidden.shape[0], chunk_rows):
            args = (hidden[s:s + chunk_rows], targets[s:s + chunk_rows], inv[s:s + chunk_rows])
            parts.append(checkpoint(chunk, *args, use_reentrant=False) if hidden.requires_grad else chunk(*args))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)
