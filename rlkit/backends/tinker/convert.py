"""rlkit's types <-> the tinker SDK's, for the ``tinker`` backend (the adapter's side).

The bridges, each stated where it happens:

- **RL losses without ``weights``**: Tinker's ``importance_sampling`` / ``ppo`` / ``cispo`` take
  ``target_tokens``, ``logprobs`` and ``advantages`` only. rlkit's take ``weights`` too; they are
  folded into the advantages, ``A' = w * A``. That is the same loss exactly for
  ``importance_sampling`` (``-sum w r A = -sum r (wA)``) and ``cispo`` (linear in A), and for
  ``ppo`` when every ``w >= 0`` (``w min(rA, clip(r) A) = min(r wA, clip(r) wA)``); a PPO batch with
  a negative weight runs through the linearised path instead (:func:`native_data` says so).
- **AdamParams**: every field is sent, so rlkit's defaults (beta2 0.999, eps 1e-8, weight decay
  0.01) hold rather than Tinker's (0.95, 1e-12, 0); ``grad_clip_norm=None`` is Tinker's 0.0 (off);
  Tinker has no LoRA+ (``lora_plus_lr_ratio`` is refused).
- **temperature**: Tinker's trainer scores at temperature 1; a per-datum ``temperature`` input
  other than 1 is refused, 1s are dropped. :func:`rlkit.composition.check_scoring_temperature` refuses a run
  that would send one before it starts (``rlkit train``'s config check), not at its first training
  call after sampling a batch.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from rlkit.errors import InvalidInputError
from rlkit.losses.builtin import BUILTIN_LOSSES
from rlkit.types import (AdamParams, Datum, ForwardBackwardOutput, SampledSequence, SampleResponse, SamplingParams,
    StopReason, TensorData, TokenLogprob, TokenUsage)

#: the built-ins that take ``advantages`` (Tinker's RL losses): ``weights`` are folded into them
RL_LOSSES = tuple(name for name, (cls, _) in BUILTIN_LOSSES.items() if "advantages" in cls.required_inputs)


def tinker_types() -> Any:
    from tinker import types

    return types


def native_data(name: str, data: Sequence[Datum]) -> Optional[List[Datum]]:
    """``data`` as Tinker's built-in ``name`` takes it, or ``None`` when that built-in would not
    compute rlkit's loss (a PPO batch with a negative weight)."""
    out = []
    for i, datum in enumerate(data):
        inputs = dict(datum.loss_fn_inputs)
        temp = inputs.pop("temperature", None)
        if temp is not None and any(abs(t - 1.0) > 1e-12 for t in temp.data):
            raise InvalidInputError(
                f"datum[{i}].loss_fn_inputs['temperature']: Tinker's trainer scores at temperature 1 only"
            )
        if name in RL_LOSSES:
            w = inputs.pop("weights").to_torch().float()
            if name == "ppo" and bool((w < 0).any()):
                return None
            inputs["advantages"] = TensorData.from_torch(inputs["advantages"].to_torch().float() * w)
        out.append(Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
    return out


def to_tinker_datum(datum: Datum) -> Any:
    types = tinker_types()
    inputs = {}
    for key, td in datum.loss_fn_inputs.items():
        dtype = "int64" if key == "target_tokens" or td.dtype.value.startswith("int") else "float32"
        array = np.asarray(td.data, dtype=np.int64 if dtype == "int64" else np.float32)
        inputs[key] = types.TensorData(data=array.tolist(), dtype=dtype, shape=[len(array)])
    return types.Datum(model_input=types.ModelInput.from_ints(datum.model_input.to_ints()), loss_fn_inputs=inputs)


def from_tinker_output(out: Any, data: Sequence[Datum]) -> ForwardBackwardOutput:
    outputs = [
        {"logprobs": TensorData(data=np.asarray(o["logprobs"].data, dtype=np.float32).reshape(-1).tolist())}
        for o in out.loss_fn_outputs
    ]
    n_tokens = sum(d.model_input.length for d in data)
    metrics: Dict[str, float] = {}
    for key, value in (
        out.metrics or {}
    ).items():  # rlkit's server sends tokens:X as tokens_X:sum (the SDK reduces by suffix)
        m = re.fullmatch(r"tokens_(\w+):sum", key)
        metrics[f"tokens:{m.group(1)}" if m else key] = float(value)
    metrics["tokens:train"] = float(n_tokens)
    if "tokens:weighted" not in metrics:  # the service does not count them: the tokens with a weight
        metrics["tokens:weighted"] = float(
            sum(int((d.loss_fn_inputs["weights"].to_torch() != 0).sum()) for d in data if "weights" in d.loss_fn_inputs)
        )
    return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics, usage=TokenUsage(train_tokens=n_tokens))


def to_tinker_adam(params: AdamParams) -> Any:
    if params.lora_plus_lr_ratio is not None:
        raise InvalidInputError("optim_step: AdamParams.lora_plus_lr_ratio: Tinker has no LoRA+ (leave it None)")
    return tinker_types().AdamParams(
        learning_rate=params.learning_rate,
        beta1=params.beta1,
        beta2=params.beta2,
        eps=params.eps,
        weight_decay=params.weight_decay,
        grad_clip_norm=params.grad_clip_norm or 0.0,
    )


def to_tinker_sampling(params: SamplingParams) -> Any:
    return tinker_types().SamplingParams(
        max_tokens=params.max_tokens,
        temperature=1.0 if params.temperature is None else params.temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        top_k=-1 if params.top_k is None else params.top_k,
        seed=params.seed,
        stop=params.stop,
    )


def model_input(tokens: List[int]) -> Any:
    """Tinker's ``ModelInput`` of checked token ids (:func:`rlkit.engine.checks.prompt_tokens`)."""
    return tinker_types().ModelInput.from_ints(tokens)


def from_tinker_sample(res: Any, prompt_len: int) -> SampleResponse:
    seqs = [
        SampledSequence(
            stop_reason=StopReason.STOP if s.stop_reason == "stop" else StopReason.LENGTH,
            tokens=list(s.tokens),
            logprobs=None if s.logprobs is None else [float(x) for x in s.logprobs],
        )
        for s in res.sequences
    ]
    topk = None
    if res.topk_prompt_logprobs is not None:
        topk = [
            None if row is None else [TokenLogprob(token_id=int(t), logprob=float(lp)) for t, lp in row]
            for row in res.topk_prompt_logprobs
        ]
    usage = TokenUsage(prefill_tokens=prompt_len, decode_tokens=sum(len(s.tokens) for s in seqs))
    return SampleResponse(sequences=seqs, prompt_logprobs=res.prompt_logprobs, topk_prompt_logprobs=topk, usage=usage)


def checkpoint_name(description: str, name: Optional[str], kind: str) -> str:
    """Tinker's ``save_state`` / ``save_weights_for_sampler`` take a *name* (a path segment); rlkit's
    first positional is a description. ``name=`` wins; else the description, made path-safe, plus
    a short unique suffix (so two saves with one description do not collide)."""
    if name:
        return name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", description or "").strip("-.")[:80]
    return f"{slug or kind}-{uuid.uuid4().hex[:8]}"


def metrics_of(response: Any) -> Dict[str, float]:
    return {k: float(v) for k, v in (getattr(response, "metrics", None) or {}).items() if isinstance(v, (int, float))}
