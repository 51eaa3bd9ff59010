"""What the strict emulator answers for a completed training operation: the shapes the SDK documents.

``sagemaker-train`` 1.27.0 documents (``types.ForwardBackwardOutput``):

- ``metrics``: "the throughput metrics (``promised_flops``, ``global_token_num``, ``mfu``,
  ``estimated_flops``) plus scalar mirrors of the loss diagnostics (``actor/pg_loss``,
  ``actor/grad_norm``, ...)";
- ``loss_fn_outputs``: "one entry per datum ... under ``actor/*`` keys", and
  ``_utils._result_datum_count``: "loss outputs are only returned when the caller asked for them".
  No field of ``ForwardConfig``/``ForwardBackwardConfig`` asks for them, so the strict emulator
  returns none (``loss_outputs="none"``); ``"actor"`` returns the documented form (one
  ``actor/pg_loss`` value per datum, never per-token logprobs);
- ``_utils.combine_forward_backward_results`` folds chunks by datum-weighted mean for every key but
  ``global_token_num`` (summed) and ``*grad_norm`` (last chunk): so a mirror is a per-datum mean,
  and ``actor/grad_norm`` is the norm of the gradient accumulated so far.

Choices where the documentation is silent (each the reading hardest for a client; see
``docs/sagemaker.md``): ``actor/pg_loss`` is the mean over datums of each datum's token-summed loss
(not rlkit's batch sum); ``actor/pg_clipfrac`` / ``actor/ppo_kl`` appear only for the clipped
losses; ``optimizerStep`` reports ``actor/lr`` and no gradient norm; FLOPs are ``2 N T`` forward and
``6 N T`` forward+backward for ``N`` parameters and ``T`` tokens against a nominal
:data:`PROMISED_FLOPS` device.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch

from rlkit.losses.builtin import builtin_loss
from rlkit.types import Datum, ForwardBackwardOutput

#: The emulated accelerator's peak (FLOP/s), for ``promised_flops`` and ``mfu``. A nominal number:
#: the emulator runs on a CPU.
PROMISED_FLOPS = 1.0e12


def forward_metrics(
    out: ForwardBackwardOutput,
    data: Sequence[Datum],
    loss_name: str,
    *,
    backward: bool,
    grad_norm: Optional[float],
    num_parameters: int,
    seconds: float,
) -> Dict[str, float]:
    tokens = sum(d.model_input.length for d in data)
    flops = (6.0 if backward else 2.0) * num_parameters * tokens
    local = out.metrics
    metrics = {
        "global_token_num": float(tokens),
        "estimated_flops": flops,
        "promised_flops": PROMISED_FLOPS,
        "mfu": flops / (PROMISED_FLOPS * seconds) if seconds > 0 else 0.0,
        "actor/pg_loss": float(local.get("loss:sum", 0.0)) / max(len(data), 1),
    }
    if grad_norm is not None:
        metrics["actor/grad_norm"] = float(grad_norm)
    if f"{loss_name}/clip_frac:mean" in local:
        metrics["actor/pg_clipfrac"] = float(local[f"{loss_name}/clip_frac:mean"])
    if f"{loss_name}/kl_sampler_trainer:mean" in local:
        metrics["actor/ppo_kl"] = float(local[f"{loss_name}/kl_sampler_trainer:mean"])
    return metrics


def per_datum_outputs(out: ForwardBackwardOutput, data: Sequence[Datum], loss_name: str, loss_config: Any) -> list:
    """The documented form of ``lossFnOutputs``: one ``actor/pg_loss`` value per datum."""
    loss = builtin_loss(loss_name, loss_config)
    entries = []
    with torch.no_grad():
        for datum, entry in zip(data, out.loss_fn_outputs):
            value, _ = loss([datum], [entry["logprobs"].to_torch().float()])
            entries.append({"actor/pg_loss": {"data": [float(value)], "dtype": "float32", "shape": [1]}})
    return entries


def forward_result(
    out: ForwardBackwardOutput,
    data: Sequence[Datum],
    loss_name: str,
    loss_config: Any,
    *,
    backward: bool,
    grad_norm: Optional[float],
    num_parameters: int,
    seconds: float,
    outputs: str,
) -> Dict[str, Any]:
    """A ``ForwardResult`` / ``ForwardBackwardResult`` as the strict emulator answers it."""
    result: Dict[str, Any] = {
        "metrics": forward_metrics(
            out, data, loss_name, backward=backward, grad_norm=grad_norm, num_parameters=num_parameters, seconds=seconds
        ),
        "tokenUsage": {"trainingTokens": int(out.usage.train_tokens)},
    }
    if outputs == "actor":
        result["lossFnOutputType"] = "TensorData"
        result["lossFnOutputs"] = per_datum_outputs(out, data, loss_name, loss_config)
    return result


def optim_result(learning_rate: float) -> Dict[str, Any]:
    """``OptimizerStepResult``: "the optimizer-step metrics, such as the learning rate"."""
    return {"metrics": {"actor/lr": float(learning_rate)}}
