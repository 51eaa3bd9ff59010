"""Target-token logprobs straight from hidden states, without keeping the ``[N, V]`` logits.

For rows ``h_n`` (the decoder's last hidden states), the output matrix ``W`` (``[V, d]``, frozen:
LoRA never trains it), targets ``y_n`` and sampling temperatures ``T_n``::

    z_n           = W h_n / T_n
    logprob_n     = z_n[y_n] - logsumexp(z_n)
    d logprob_n / d h_n = (W[y_n] - E_{p_n}[W]) / T_n,   p_n = softmax(z_n),  E_{p_n}[W] = p_n^T W

The forward pass runs in chunks of rows, so only one chunk's logits exist at a time, and while a
chunk's ``p_n`` is at hand it also computes ``E_{p_n}[W]`` (``[N, d]``, small). The backward pass
is then one gather and one subtraction: no logits are kept for it and none are recomputed. The
matrix products are the ones plain autograd would do (``W h`` forward, ``p^T W`` for the input
gradient), so the cost is the same, and none of the ``[N, V]`` tensors plain autograd makes
(logits, their softmax, their gradient: 0.4 GB each in float32 for 2048 tokens of a 49k
vocabulary) outlives its chunk. Measured on a 16 x 256 LoRA step of SmolLM2-135M
(``benchmarks/README.md``): peak RSS -0.3 GiB in fp32 and -0.44 GiB in bf16, bf16 steps 15%
faster. The same idea is the "fused linear cross-entropy" of Liger Kernel
(Hsu et al. 2024, arXiv:2410.10989), here without the weight gradient since ``W`` is frozen.

The gradient is exact only for losses that read the logprobs — every rlkit loss does: the
session API hands losses per-token logprobs, never logits.
"""

from __future__ import annotations

from typing import Optional

import torch

CHUNK_ROWS = 256  # rows of logits at a time: 256 x 49k float32 = 48 MiB a tensor for SmolLM2 (1024 peaked 0.6 GiB higher, 5 % faster)


class TargetLogprobs(torch.autograd.Function):
    """``TargetLogprobs.apply(hidden [N, d], weight [V, d], bias [V] | None, targets [N],
    inv_temperature [N], compute_dtype, chunk_rows)`` -> ``[N]`` float32 logprobs (gradient to
    ``hidden`` only; a bias shifts the logits and leaves the gradient formula unchanged)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_temperature, compute_dtype, chunk_rows):  # type: ignore[override]
        n = hidden.shape[0]
        need_grad = ctx.needs_input_grad[0]
        w = weight.to(compute_dtype)
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        expected = torch.empty((n, weight.shape[1]), dtype=torch.float32, device=hidden.device) if need_grad else None
        for s in range(0, n, chunk_rows):
            e = min(s + chunk_rows, n)
            logits = (hidden[s:e].to(compute_dtype) @ w.T).float()
            if bias is not None:
                logits.add_(bias)
            logits.mul_(inv_temperature[s:e].unsqueeze(-1))
            lse = torch.logsumexp(logits, dim=-1)
            out[s:e] = logits.gather(-1, targets[s:e].unsqueeze(-1)).squeeze(-1) - lse
            if need_grad:
                probs = logits.sub_(lse.unsqueeze(-1)).exp_()  # in place: the chunk's softmax
                expected[s:e] = (probs.to(compute_dtype) @ w).float()
        if need_grad:
            ctx.save_for_backward(weight, targets, inv_temperature, expected)
            ctx.hidden_dtype = hidden.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        weight, targets, inv_temperature, expected = ctx.saved_tensors
        scale = (grad_out.float() * inv_temperature).unsqueeze(-1)
        grad_hidden = scale * (weight[targets].float() - expected)
        return grad_hidden.to(ctx.hidden_dtype), None, None, None, None, None, None


def target_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: Optional[torch.Tensor] = None,
    *,
    bias: Optional[torch.Tensor] = None,
    compute_dtype: Optional[torch.dtype] = None,
    chunk_rows: int = CHUNK_ROWS,
) -> torch.Tensor:
    """``log softmax((W h_n + b) / T_n)[y_n]`` for every row ``n`` (see the module docstring)."""
    if temperature is None:
        inv = torch.ones(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    else:
        inv = 1.0 / temperature.to(device=hidden.device, dtype=torch.float32)
    with torch.autocast(hidden.device.type, enabled=False):
        return TargetLogprobs.apply(hidden, weight.detach(), None if bias is None else bias.detach().float(), targets.to(device=hidden.device, dtype=torch.long), inv, compute_dtype or hidden.dtype, int(chunk_rows))
