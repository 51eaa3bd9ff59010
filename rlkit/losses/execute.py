"""Run any :class:`~rlkit.losses.Loss` on any training client: the one dispatch path (DESIGN §3).

``run_loss(trainer, data, loss, aggregation=...)`` decides once, for every loop and backend:

1. **native** — the loss *is* a built-in (:meth:`Loss.native_call`: its class declares
   ``builtin`` in its own body and its options are the built-in's) and the backend supports that
   built-in with that config (``trainer.supports_builtin_loss``): one ``forward_backward`` call with
   that built-in, the aggregation compiled into the weights (:func:`compile_weights`), the batch rewritten
   by :meth:`Loss.native_data` where the loss compiles to another built-in.
2. **native object** — anything else, on an engine whose capabilities say it runs a
   :class:`Loss` object itself (``trainer.capabilities.native_custom_losses``: the local engine):
   the loss (its aggregation compiled into the weights, or the normaliser applied around it) is
   handed to ``forward_backward`` as an object and differentiated in one pass.
3. **linearised** — anything else (DPO, GSPO, a research subclass, PPO with dual clip or an
   off-policy correction): ``forward`` returns the trainer's per-token logprobs ``lp``; the loss
   (wrapped in :class:`Aggregated` unless ``sum``) and ``g = dL/dlp`` are computed here with
   autograd over the whole batch; then ``forward_backward("cross_entropy", weights = -g)``.
   Cross-entropy is ``-sum w lp``, whose gradient in ``lp`` is ``-w = g``, so the backend
   accumulates exactly ``dL/dtheta = sum g * dlp/dtheta`` — the same gradient, for one extra
   forward pass, on every backend.

In both native cases the trainer's ``forward_backward`` receives the loss object it runs (the
built-in a loss *is*, :func:`~rlkit.losses.builtin.as_builtin`), and its front door validates that
call once; nothing downstream builds the loss again.

Both return an :class:`~rlkit.futures.APIFuture` of a
:class:`~rlkit.types.ForwardBackwardOutput`. The linearised path waits for its forward pass
before returning, so anything the caller submits next (``optim_step``) stays behind its backward.
:func:`score_loss` is the forward-only twin (evaluation: the loss's value and metrics, no gradient).

A trainer's own front door (:func:`rlkit.engine.dispatch.dispatch`) linearises the calls its engine
cannot run natively with :func:`linearised_backward` / :func:`linearised_forward`. This module
drives a trainer through its public methods only and imports nothing of :mod:`rlkit.engine`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch

from rlkit.errors import InvalidInputError
from rlkit.futures import APIFuture
from rlkit.losses.aggregation import Aggregated, check_aggregation, check_allowed, compile_weights, normaliser
from rlkit.losses.base import Loss, NativeCall, datum_input
from rlkit.losses.builtin import as_builtin
from rlkit.types import Datum, ForwardBackwardOutput, TensorData

CE_INPUTS = ("target_tokens", "weights", "temperature")


def native_call_for(trainer: Any, loss: Loss, aggregation: str = "sum") -> Optional[NativeCall]:
    """The built-in call ``loss`` runs as on ``trainer``, or ``None`` (linearised)."""
    call = loss.native_call()
    if call is None or not trainer.supports_builtin_loss(call.name, call.config):
        return None
    if aggregation != "sum" and not loss.linear_in_weights:  # the aggregation cannot be compiled in
        return None
    return call


def runs_loss_objects(trainer: Any) -> bool:
    """Whether ``trainer``'s engine differentiates a :class:`Loss` object itself (its declared
    :class:`~rlkit.engine.capabilities.Capabilities`)."""
    return bool(trainer.capabilities.native_custom_losses)


def native_objective(data: List[Datum], loss: Loss, aggregation: str, constant: Optional[float]):
    """``(batch, loss)`` to hand an engine that runs Loss objects: a loss linear in its weights
    gets the aggregation compiled into them (exact, and it stays separable so the engine may split
    the batch); any other is divided by its normaliser, computed here over the whole batch — a
    constant factor, so a separable loss stays separable."""
    if aggregation == "sum":
        return data, loss
    if loss.linear_in_weights:
        return compile_weights(data, aggregation, constant), loss
    scale = normaliser(loss, data, aggregation, constant)
    return data, (loss if scale == 1.0 else (1.0 / scale) * loss)


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
        raise InvalidInputError(f"{loss.name}: the loss is {float(value.detach())} (not finite); nothing was sent")
    raw = torch.autograd.grad(value, leaves, allow_unused=True)  # None for a datum the loss does not use
    grads = [torch.zeros_like(lp) if g is None else g for g, lp in zip(raw, leaves)]
    return value, metrics, grads


def _prepare(data: Sequence[Datum], loss: Loss, aggregation: str, constant: Optional[float]) -> List[Datum]:
    check_aggregation(aggregation, constant)
    data = list(data)
    loss.validate(data)
    check_allowed(loss, aggregation)
    return data


def run_loss(
    trainer: Any,
    data: Sequence[Datum],
    loss: Loss,
    *,
    aggregation: str = "sum",
    constant: Optional[float] = None,
    force_linearised: bool = False,
    logprobs: bool = False,
) -> APIFuture[ForwardBackwardOutput]:
    """Accumulate the gradient of ``loss`` (aggregated by ``aggregation``) on ``trainer``.

    ``logprobs=True``: the result must carry the trainer's per-token logprobs
    (``loss_fn_outputs[i]["logprobs"]``). The local and Tinker backends return them with every pass
    anyway, and the linearised path always has them (its forward pass); a backend whose service
    computes the built-in losses itself and returns none (SageMaker, ``trainer.logprobs_on_request``)
    scores them only when asked, at the cost of a ``compute_logprobs`` round trip. Without them,
    :func:`weighted_nll` still reads a cross-entropy pass's NLL from each datum's ``"loss"``."""
    check_aggregation(aggregation, constant)
    data = list(data)
    check_allowed(loss, aggregation)
    call = None if force_linearised else native_call_for(trainer, loss, aggregation)
    if call is not None or (not force_linearised and runs_loss_objects(trainer)):
        builtin = loss if call is None else as_builtin(loss)
        if aggregation == "sum" and builtin is loss:  # sent as it is: the call validates it, once
            batch = data if call is None else loss.native_data(data)
        else:  # checked before its weights are compiled or its batch rewritten (errors name this loss)
            loss.validate(data)
            if call is None:
                batch, builtin = native_objective(data, loss, aggregation, constant)
            else:
                batch = loss.native_data(compile_weights(data, aggregation, constant) if aggregation != "sum" else data)
        extra = {"return_logprobs": True} if call is not None and logprobs and getattr(trainer, "logprobs_on_request", False) else {}
        return trainer.forward_backward(batch, builtin, **extra)
    loss.validate(data)
    return linearised_backward(trainer, data, loss if aggregation == "sum" else Aggregated(loss, aggregation, constant))


def linearised_backward(trainer: Any, data: List[Datum], objective: Loss) -> APIFuture[ForwardBackwardOutput]:
    """The linearised path on a batch ``objective`` already validated: a ``forward`` for the
    trainer's logprobs, ``objective`` and its gradient ``g`` here, then
    ``forward_backward("cross_entropy", weights=-g)``."""
    forward = trainer.forward([cross_entropy_view(d) for d in data], "cross_entropy").result()
    logprobs = per_datum_logprobs(forward)
    value, metrics, grads = linearised_gradient(objective, data, logprobs)
    backward = trainer.forward_backward([cross_entropy_view(d, -g) for d, g in zip(data, grads)], "cross_entropy")
    client_metrics: Dict[str, float] = {**metrics, "loss:sum": float(value.detach()), "linearised": 1.0}

    def merge(out: ForwardBackwardOutput) -> ForwardBackwardOutput:
        merged = {f"backend/{k}": v for k, v in out.metrics.items()}
        merged.update(client_metrics)
        merged["tokens:train"] = out.metrics.get("tokens:train", 0.0) + forward.metrics.get("tokens:train", 0.0)
        return ForwardBackwardOutput(loss_fn_outputs=forward.loss_fn_outputs, metrics=merged, usage=out.usage + forward.usage)

    return backward.then(merge, operation="forward_backward(linearised)")


def score_loss(
    trainer: Any, data: Sequence[Datum], loss: Loss, *, aggregation: str = "sum", constant: Optional[float] = None
) -> APIFuture[ForwardBackwardOutput]:
    """The loss's value and metrics on ``data`` with no gradient (one ``forward``)."""
    data = _prepare(data, loss, aggregation, constant)
    return linearised_forward(trainer, data, loss if aggregation == "sum" else Aggregated(loss, aggregation, constant))


def linearised_forward(trainer: Any, data: List[Datum], objective: Loss) -> APIFuture[ForwardBackwardOutput]:
    """``objective``'s value and metrics on a batch it already validated, from one ``forward``."""
    forward = trainer.forward([cross_entropy_view(d) for d in data], "cross_entropy")

    def score(out: ForwardBackwardOutput) -> ForwardBackwardOutput:
        with torch.no_grad():
            value, metrics = objective(data, per_datum_logprobs(out))
        return ForwardBackwardOutput(loss_fn_outputs=out.loss_fn_outputs, metrics={**metrics, "loss:sum": float(value), "linearised": 1.0}, usage=out.usage)

    return forward.then(score, operation="forward(linearised)")


def per_datum_logprobs(output: ForwardBackwardOutput) -> List[torch.Tensor]:
    """The trainer's logprobs of each datum from a forward/forward_backward output."""
    return [o["logprobs"].to_torch().float() for o in output.loss_fn_outputs]


def has_trainer_logprobs(output: ForwardBackwardOutput, n: Optional[int] = None) -> bool:
    """Whether every datum's output carries the trainer's per-token logprobs."""
    outs = output.loss_fn_outputs
    return bool(outs) and (n is None or len(outs) == n) and all("logprobs" in o for o in outs)


def weighted_nll(output: ForwardBackwardOutput, data: Sequence[Datum], aggregation: str = "sum", constant: Optional[float] = None) -> float:
    """``sum_i sum_t -w_it * log p_it`` of a cross-entropy pass run by :func:`run_loss` on ``data``
    (the weights as given, before aggregation), without asking for the trainer's logprobs where
    they cost extra: from the logprobs when the output carries them; else from each datum's summed
    loss (``loss_fn_outputs[i]["loss"]``) or, when the aggregation scales every datum alike (sum,
    token_mean, constant), from ``metrics["loss:sum"]``, divided by the factor the aggregation put
    on the weights. ``nan`` when none of these is there (``seq_mean`` on a service that returns
    neither: ask for logprobs, :func:`nll_needs_logprobs`)."""
    if has_trainer_logprobs(output, len(data)):
        return float(sum(float((-(lp * datum_input(d, "weights"))).sum()) for lp, d in zip(per_datum_logprobs(output), data)))
    from rlkit.losses.aggregation import weight_scales

    scales = weight_scales(data, aggregation, constant)
    outs = output.loss_fn_outputs
    if len(outs) == len(data) and all("loss" in o for o in outs):
        return float(sum(float(o["loss"].to_torch().sum()) / s for o, s in zip(outs, scales) if s))
    nonzero = {s for s in scales if s}
    if "loss:sum" in output.metrics and len(nonzero) <= 1:
        return float(output.metrics["loss:sum"]) / nonzero.pop() if nonzero else 0.0
    return float("nan")


def nll_needs_logprobs(aggregation: str) -> bool:
    """Whether :func:`weighted_nll` needs the trainer's logprobs under ``aggregation`` (only
    ``seq_mean`` scales datums differently, so the batch's loss alone does not give the NLL)."""
    return aggregation == "seq_mean"


__all__ = ["run_loss", "score_loss", "linearised_backward", "linearised_forward", "native_call_for", "linearised_gradient", "per_datum_logprobs", "has_trainer_logprobs", "weighted_nll", "nll_needs_logprobs", "datum_input"]
