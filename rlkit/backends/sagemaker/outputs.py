"""Reading ``forward``/``forward_backward`` results on either reading of the service.

The SDK documents (``types.ForwardBackwardOutput``) that ``metrics`` holds throughput keys
(``global_token_num``, ``mfu``, ...) plus ``actor/*`` mirrors (``actor/pg_loss``,
``actor/grad_norm``, ...) and that per-datum loss outputs come back only when asked for, under
``actor/*`` keys. The permissive emulator (and possibly a future service) answers more: rlkit's own
metric names and per-token ``logprobs``. This module turns either answer into what rlkit's loops read:

- :func:`merge_chunks` folds the results of one batch sent as several requests the way the SDK's
  ``combine_forward_backward_results`` does: a datum-weighted mean for every key, except
  ``global_token_num`` (summed) and ``*grad_norm`` (the last chunk's: the gradient accumulated over
  the whole batch). Keys in rlkit's own ``name:agg`` vocabulary keep the local engine's rule
  (``:mean`` weighted by ``tokens:weighted``, the rest summed).
- :func:`service_logprobs` finds the trainer's per-token logprobs among a datum's outputs (``logprobs``
  or an ``actor/``-namespaced ``.../logprobs``), or ``None``: then the training client scores them
  with the session itself (:mod:`.scoring`).
- :func:`with_datum_losses` names each datum's ``actor/pg_loss`` ``"loss"`` when no logprobs were
  asked for (SFT and distillation read their NLL from it, :func:`rlkit.losses.weighted_nll`).
- :func:`rlkit_metrics` adds what the loops read: ``grad_norm`` from ``actor/grad_norm``,
  ``tokens:train`` from ``global_token_num``, and the built-in loss's own metrics (``loss:sum``,
  ``tokens:weighted``, ``cross_entropy/nll:mean``, ``ppo/clip_frac:mean``, ...) computed on the client
  from the trainer's logprobs with the same code the local engine runs. Keys the service reported
  itself are never overwritten.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from rlkit.types import Datum, ForwardBackwardOutput, TensorData, TokenUsage

#: Counts (summed over chunks), per the SDK's ``_utils.SUMMED_METRICS``.
SUMMED = frozenset({"global_token_num"})
#: Service metric -> the rlkit name loops read.
RENAMED = {"actor/grad_norm": "grad_norm", "global_token_num": "tokens:train"}
_LOGPROB_KEYS = ("logprobs", "log_probs", "log_prob", "logprob")


def _rlkit_key(key: str) -> bool:
    """rlkit's own vocabulary (``loss:sum``, ``ppo/clip_frac:mean``, ``tokens:train``)."""
    return ":" in key


def merge_chunks(parts: Sequence[ForwardBackwardOutput], datum_counts: Sequence[int]) -> ForwardBackwardOutput:
    """One batch's chunk results as one result (see the module docstring for the rule)."""
    if len(parts) == 1:
        return parts[0]
    metrics: Dict[str, float] = {}
    keys = list(dict.fromkeys(k for p in parts for k in p.metrics))
    for key in keys:
        present = [(p.metrics[key], max(n, 1), p) for p, n in zip(parts, datum_counts) if key in p.metrics]
        if key == "grad_norm" or key.endswith("/grad_norm"):
            if key in parts[-1].metrics:
                metrics[key] = parts[-1].metrics[key]
        elif key in SUMMED:
            metrics[key] = sum(v for v, _, _ in present)
        elif _rlkit_key(key):
            if key.endswith(":mean"):
                weighted = [(v, p.metrics.get("tokens:weighted", 0.0)) for v, _, p in present]
                total = sum(w for _, w in weighted)
                if total:
                    metrics[key] = sum(v * w for v, w in weighted) / total
            else:
                metrics[key] = sum(v for v, _, _ in present)
        else:
            total = sum(w for _, w, _ in present)
            metrics[key] = sum(v * w for v, w, _ in present) / total
    usage = TokenUsage()
    for p in parts:
        usage = usage + p.usage
    return ForwardBackwardOutput(
        loss_fn_outputs=[o for p in parts for o in p.loss_fn_outputs], metrics=metrics, usage=usage
    )


def service_logprobs(entry: Mapping[str, TensorData]) -> Optional[TensorData]:
    """The trainer's per-token logprobs in one datum's outputs, if the service returned them."""
    if "logprobs" in entry:
        return entry["logprobs"]
    for key, value in entry.items():
        if key.rsplit("/", 1)[-1] in _LOGPROB_KEYS:
            return value
    return None


def has_logprobs(out: ForwardBackwardOutput, data: Sequence[Datum]) -> bool:
    """Whether ``out`` carries per-token logprobs, one per token, for every datum."""
    if len(out.loss_fn_outputs) != len(data):
        return False
    for entry, datum in zip(out.loss_fn_outputs, data):
        lp = service_logprobs(entry or {})
        if lp is None or len(lp.data) != datum.model_input.length:
            return False
    return True


def with_logprobs(out: ForwardBackwardOutput, logprobs: Sequence[TensorData]) -> ForwardBackwardOutput:
    """``out`` whose ``loss_fn_outputs[i]["logprobs"]`` are ``logprobs[i]`` (other keys kept)."""
    entries: List[Dict[str, TensorData]] = []
    for i, lp in enumerate(logprobs):
        entry = dict(out.loss_fn_outputs[i]) if i < len(out.loss_fn_outputs) and out.loss_fn_outputs[i] else {}
        entry["logprobs"] = lp
        entries.append(entry)
    return ForwardBackwardOutput(
        loss_fn_output_type=out.loss_fn_output_type, loss_fn_outputs=entries, metrics=dict(out.metrics), usage=out.usage
    )


def with_datum_losses(out: ForwardBackwardOutput) -> ForwardBackwardOutput:
    """``out`` whose entries also hold each datum's summed loss as ``"loss"`` (from the service's
    documented ``actor/pg_loss``), for results that carry no logprobs."""
    entries: List[Dict[str, TensorData]] = []
    for entry in out.loss_fn_outputs:
        entry = dict(entry or {})
        if "loss" not in entry and "actor/pg_loss" in entry:
            entry["loss"] = entry["actor/pg_loss"]
        entries.append(entry)
    return ForwardBackwardOutput(
        loss_fn_output_type=out.loss_fn_output_type, loss_fn_outputs=entries, metrics=dict(out.metrics), usage=out.usage
    )


def rlkit_metrics(out: ForwardBackwardOutput, data: Sequence[Datum], loss: Any) -> Dict[str, float]:
    """``out.metrics`` plus the rlkit names loops read (never overwriting a service key); ``loss``
    is the built-in the service computed (the call's validated object: its own metrics, on the
    trainer's logprobs, where the result carries them)."""
    import torch

    from rlkit.losses.builtin import builtin_call

    loss_name = builtin_call(loss).name
    metrics = dict(out.metrics)
    for service_key, name in RENAMED.items():
        if service_key in metrics and name not in metrics:
            metrics[name] = float(metrics[service_key])
    metrics.setdefault("tokens:train", float(sum(d.model_input.length for d in data)))
    logprobs = [service_logprobs(entry or {}) for entry in out.loss_fn_outputs]
    if len(logprobs) == len(data) and all(lp is not None for lp in logprobs):
        with torch.no_grad():
            _, client = loss(list(data), [lp.to_torch().float() for lp in logprobs])
        for key, value in client.items():
            metrics.setdefault(key, float(value))
    else:  # no logprobs: what the service's documented mirrors give
        if "actor/pg_loss" in metrics and "loss:sum" not in metrics:
            # the service's mean over datums of each datum's summed loss
            metrics["loss:sum"] = float(metrics["actor/pg_loss"]) * len(data)
        for service_key, suffix in (("actor/pg_clipfrac", "clip_frac:mean"), ("actor/ppo_kl", "kl_sampler_trainer:mean")):
            if service_key in metrics:
                metrics.setdefault(f"{loss_name}/{suffix}", float(metrics[service_key]))
    if "tokens:weighted" not in metrics:
        metrics["tokens:weighted"] = float(sum(int((d.loss_fn_inputs["weights"].to_torch() != 0).sum()) for d in data if "weights" in d.loss_fn_inputs))
    return metrics


__all__ = ["merge_chunks", "service_logprobs", "has_logprobs", "with_logprobs", "with_datum_losses", "rlkit_metrics", "RENAMED", "SUMMED"]
