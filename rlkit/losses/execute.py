"""Run any :class:`~rlkit.losses.Loss` on any training client (DESIGN §3).

``run_loss(trainer, data, loss, aggregation=...)`` picks the path:

1. **native** — the loss equals a built-in the backend supports (``loss.builtin`` +
   ``loss.builtin_config()``, or a loss that rewrites its batch for one, like
   ``ReverseKLDistillation`` -> ``importance_sampling``): one ``forward_backward`` call, with the
   aggregation compiled into the weights.
2. **linearised** — anything else (DPO, GSPO, a research subclass): ``forward`` returns the
   trainer's per-token logprobs ``lp``; the loss and ``g = dL/dlp`` are computed here with
   autograd; then ``forward_backward("cross_entropy", weights = -g)``. Cross-entropy is
   ``-sum w lp``, whose gradient in ``lp`` is ``-w = g``, so the backend accumulates exactly
   ``dL/dtheta = sum g * dlp/dtheta`` — the same gradient, for one extra forward pass.

Both return an :class:`~rlkit.futures.APIFuture` of a
:class:`~rlkit.types.ForwardBackwardOutput`. The linearised path waits for its forward pass
before returning, so anything the caller submits next (``optim_step``) stays behind its backward.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from rlkit.futures import APIFuture
from rlkit.losses.aggregation import Aggregated, check_aggregation, compile_weights
from rlkit.losses.base import Loss, datum_input
from rlkit.types import Datum, ForwardBackwardOutput, TensorData

CE_INPUTS = ("target_tokens", "weights", "temperature")


def native_plan(trainer: Any, loss: Loss, data: Sequence[Datum]):
    """``(builtin name, config, data)`` if ``loss`` can run natively on ``trainer``, else None."""
    supports = getattr(trainer, "supports_builtin_loss", None)
    if supports is None:
        return None
    builtin = loss.builtin
    if builtin and supports(builtin, loss.builtin_config()):
        return builtin, loss.builtin_config(), list(data)
    target = getattr(loss, "builtin_target", None)
    if target and supports(target, None):
        return target, None, loss.to_builtin_data(data)
    return None


def cross_entropy_view(datum: Datum, weights: Optional[torch.Tensor] = None) -> Datum:
    """The datum with only cross-entropy inputs (``weights`` replaced when given)."""
    inputs = {k: v for k, v in datum.loss_fn_inputs.items() if k in CE_INPUTS}
    n = datum.model_input.length
    inputs["weights"] = TensorData.from_torch(weights.float()) if weights is not None else TensorData(data=[0.0] * n)
    return Datum(model_input=datum.model_input, loss_fn_inputs=inputs)


def linearised_gradient(loss: Loss, data: Sequence[Datum], logprobs: Sequence[torch.Tensor]):
    """``(value, metrics, [dL/dlp_i])`` computed on the client with autograd."""
    leaves = [lp.detach().clone().float().requires_grad_(True) for lp in logprobs]
    value, metrics = loss(data, leaves)
    if not torch.isfinite(value):
        from rlkit.errors import InvalidInputError

        raise InvalidInputError(f"{loss.name}: the loss is {float(value.detach())} (not finite); nothing was sent")
    grads = torch.autograd.grad(value, leaves, allow_unused=True)
    grads = [torch.zeros_like(lp) if g is None else g for g, lp in zip(grads, leaves)]
    return value, metrics, grads


def run_loss(
    trainer: Any,
    data: Sequence[Datum],
    loss: Loss,
    *,
    aggregation: str = "sum",
    constant: Optional[float] = None,
    force_linearised: bool = False,
) -> APIFuture[ForwardBackwardOutput]:
    """Accumulate the gradient of ``loss`` (aggregated by ``aggregation``) on ``trainer``."""
    check_aggregation(aggregation, constant)
    data = list(data)
    loss.validate(data)
    if aggregation != "sum":
        if loss.linear_in_weights:
            data = compile_weights(data, aggregation, constant)
        else:
            loss = Aggregated(loss, aggregation, constant)
    plan = None if force_linearised else native_plan(trainer, loss, data)
    if plan is not None:
        name, config, native_data = plan
        return trainer.forward_backward(native_data, name, loss_fn_config=config)

    forward = trainer.forward([cross_entropy_view(d) for d in data], "cross_entropy").result()
    logprobs = [out["logprobs"].to_torch().float() for out in forward.loss_fn_outputs]
    value, metrics, grads = linearised_gradient(loss, data, logprobs)
    backward = trainer.forward_backward([cross_entropy_view(d, -g) for d, g in zip(data, grads)], "cross_entropy")
    client_metrics: Dict[str, float] = {**metrics, "loss:sum": float(value.detach()), "linearised": 1.0}

    def merge(out: ForwardBackwardOutput) -> ForwardBackwardOutput:
        merged = {f"backend/{k}": v for k, v in out.metrics.items()}
        merged.update(client_metrics)
        merged["tokens:train"] = out.metrics.get("tokens:train", 0.0) + forward.metrics.get("tokens:train", 0.0)
        return ForwardBackwardOutput(
            loss_fn_outputs=forward.loss_fn_outputs,
            metrics=merged,
            usage=out.usage + forward.usage,
        )

    return backward.then(merge, operation="forward_backward(linearised)")


def per_datum_logprobs(output: ForwardBackwardOutput) -> List[torch.Tensor]:
    """The trainer's logprobs of each datum from a forward/forward_backward output."""
    return [o["logprobs"].to_torch().float() for o in output.loss_fn_outputs]


__all__ = ["run_loss", "native_plan", "linearised_gradient", "per_datum_logprobs", "datum_input"]
