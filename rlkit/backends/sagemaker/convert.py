"""rlkit types <-> the runtime's wire shapes (``sagemakertrainingsessionruntime`` 2025-02-10).

Used by the adapter (rlkit -> wire on the way out, wire -> rlkit on the way back) and by the
emulator (the reverse). Pure functions over dicts; no SDK import.

The ``max_tokens`` rule lives here too (:func:`service_max_tokens`, :func:`truncate_sequences`):
the service refuses ``maxTokens < 512``, while RL loops on small models often ask for a handful
of tokens. The adapter asks the service for ``max(max_tokens, 512)`` tokens and cuts each
sequence at the requested length on the client, marking a cut sequence ``stop_reason="length"``.
Sampling is autoregressive and per-request seeded, so the first ``n`` tokens (and their
logprobs) are the same ones a ``max_tokens=n`` request would have produced; the cost is that the
service decodes — and bills — up to 512 tokens per sequence. ``SampleResponse.usage`` reports
those billed tokens, not the kept ones.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from rlkit.types import (AdamParams, Datum, EncodedTextChunk, ForwardBackwardOutput, ModelInput, SampledSequence,
    SampleResponse, SamplingParams, StopReason, TensorData, TokenLogprob, TokenUsage)

# -- requests ---------------------------------------------------------------------------------------


def model_input_to_wire(model_input: ModelInput) -> Dict[str, Any]:
    return {"chunks": [{"tokens": list(c.tokens), "type": "encoded_text"} for c in model_input.chunks]}


def tokens_to_wire(tokens: Sequence[int]) -> Dict[str, Any]:
    return {"chunks": [{"tokens": [int(t) for t in tokens], "type": "encoded_text"}]}


def compact_floats(values: Sequence[float]) -> List[float]:
    """``values`` as the floats whose ``repr`` is the shortest decimal that reads back as the same
    float32 (``-0.6931472``, not ``-0.6931471824645996``): what a float32 tensor needs, and what keeps
    a request within the SDK's size estimate of ~10 bytes per value (``_utils._estimate_datum_bytes``).
    Repeated values (weights, per-sequence advantages) are formatted once."""
    import numpy as np

    arr = np.asarray(values, dtype=np.float32)
    if arr.size == 0:
        return []
    unique, inverse = np.unique(arr, return_inverse=True)
    short = np.array([float(str(v)) for v in unique], dtype=np.float64)  # numpy's shortest float32 repr
    return short[inverse.reshape(-1)].tolist()


def tensor_to_request(t: TensorData) -> Dict[str, Any]:
    """A loss input on the wire: integers as they are, floats no longer than float32 needs."""
    d = t.model_dump_wire()
    if t.dtype.value == "float32":
        d["data"] = compact_floats(d["data"])
    return d


def datum_to_wire(datum: Datum) -> Dict[str, Any]:
    out: Dict[str, Any] = {"modelInput": model_input_to_wire(datum.model_input)}
    if datum.loss_fn_inputs:
        out["lossFnInputs"] = {k: tensor_to_request(v) for k, v in datum.loss_fn_inputs.items()}
    return out


def adam_to_wire(params: AdamParams) -> Dict[str, Any]:
    d: Dict[str, Any] = {
        "learningRate": params.learning_rate,
        "beta1": params.beta1,
        "beta2": params.beta2,
        "eps": params.eps,
        "weightDecay": params.weight_decay,
    }
    if params.grad_clip_norm is not None:
        d["gradClipNorm"] = params.grad_clip_norm
    if params.lora_plus_lr_ratio is not None:
        d["loraPlusLrRatio"] = params.lora_plus_lr_ratio
    return d


def service_max_tokens(requested: int, floor: int) -> int:
    """What to ask the service for: at least its floor."""
    return max(int(requested), int(floor))


# -- wire -> rlkit (emulator side of requests) --------------------------------------------------------


def wire_to_model_input(raw: Mapping[str, Any]) -> ModelInput:
    return ModelInput(chunks=[EncodedTextChunk(tokens=list(c["tokens"])) for c in raw["chunks"]])


def wire_to_tensor(raw: Mapping[str, Any]) -> TensorData:
    return TensorData(data=list(raw["data"]), dtype=raw.get("dtype", "float32"), shape=raw.get("shape"))


def wire_to_datum(raw: Mapping[str, Any]) -> Datum:
    inputs = {k: wire_to_tensor(v) for k, v in (raw.get("lossFnInputs") or {}).items()}
    return Datum(model_input=wire_to_model_input(raw["modelInput"]), loss_fn_inputs=inputs)


def wire_to_adam(raw: Mapping[str, Any]) -> AdamParams:
    names = {
        "learningRate": "learning_rate",
        "beta1": "beta1",
        "beta2": "beta2",
        "eps": "eps",
        "weightDecay": "weight_decay",
        "gradClipNorm": "grad_clip_norm",
        "loraPlusLrRatio": "lora_plus_lr_ratio",
    }
    return AdamParams(**{names[k]: v for k, v in raw.items() if k in names and v is not None})


def wire_to_sampling_params(raw: Mapping[str, Any]) -> SamplingParams:
    names = {"maxTokens": "max_tokens", "temperature": "temperature", "topP": "top_p", "topK": "top_k", "seed": "seed", "stop": "stop"}
    return SamplingParams(**{names[k]: v for k, v in raw.items() if k in names and v is not None})


# -- results ----------------------------------------------------------------------------------------


def tensor_to_wire(t: TensorData) -> Dict[str, Any]:
    return t.model_dump_wire()


def forward_result_to_wire(out: ForwardBackwardOutput) -> Dict[str, Any]:
    return {
        "lossFnOutputType": out.loss_fn_output_type,
        "lossFnOutputs": [{k: tensor_to_wire(v) for k, v in entry.items()} for entry in out.loss_fn_outputs],
        "metrics": {k: float(v) for k, v in out.metrics.items()},
        "tokenUsage": {"trainingTokens": int(out.usage.train_tokens)},
    }


def wire_to_forward_output(raw: Mapping[str, Any]) -> ForwardBackwardOutput:
    """A ``forward``/``forwardBackward`` result (the SDK output's ``_raw`` sub-result), as sent:
    :mod:`.outputs` finds the logprobs and maps the metric names."""
    outputs = []
    for entry in raw.get("lossFnOutputs") or []:
        outputs.append({k: wire_to_tensor(v) if isinstance(v, Mapping) else TensorData(data=list(v)) for k, v in entry.items()})
    usage = raw.get("tokenUsage") or {}
    metrics = {k: float(v) for k, v in (raw.get("metrics") or {}).items() if isinstance(v, (int, float))}
    return ForwardBackwardOutput(
        loss_fn_output_type=raw.get("lossFnOutputType") or "TensorData",
        loss_fn_outputs=outputs,
        metrics=metrics,
        usage=TokenUsage(train_tokens=int(usage.get("trainingTokens") or metrics.get("tokens:train", 0))),
    )


def sample_response_to_wire(resp: SampleResponse) -> Dict[str, Any]:
    """The emulator's ``sample`` result. Per-sequence ``tokenUsage``: the prompt is prefilled once
    per request, so it is counted on the first sequence; summing over sequences gives what the
    request billed."""
    seqs = []
    for i, s in enumerate(resp.sequences):
        entry: Dict[str, Any] = {
            "stopReason": s.stop_reason.value,
            "tokens": list(s.tokens),
            "tokenUsage": {"prefill": resp.usage.prefill_tokens if i == 0 else 0, "decode": len(s.tokens)},
        }
        if s.logprobs is not None:
            entry["logprobs"] = [float(x) for x in s.logprobs]
        seqs.append(entry)
    out: Dict[str, Any] = {"sequences": seqs}
    # The first prompt token has no logprob. The SDK types promptLogprobs as a list of numbers (a
    # null fails its parsing), so the emulator sends one value per prompt token *after the first*;
    # :func:`prompt_logprobs_to_rlkit` restores rlkit's leading None.
    if resp.prompt_logprobs is not None:
        out["promptLogprobs"] = [float(x) for x in resp.prompt_logprobs[1:]]
    if resp.topk_prompt_logprobs is not None:
        out["topkPromptLogprobs"] = [[{"tokenId": t.token_id, "logprob": t.logprob} for t in pos or []] for pos in resp.topk_prompt_logprobs[1:]]
    return out


def prompt_logprobs_to_rlkit(values: Optional[Sequence[Any]], n_prompt: int) -> Optional[List[Any]]:
    """One entry per prompt token, the first ``None`` (the service may omit the first position)."""
    if values is None:
        return None
    values = list(values)
    if len(values) == n_prompt - 1:
        values = [None] + values
    elif values and values[0] in ([], 0.0) and len(values) == n_prompt:
        values[0] = None
    return values


def truncate_sequences(sequences: Sequence[Any], max_tokens: int) -> Tuple[List[SampledSequence], int]:
    """Cut SDK/wire sequences at ``max_tokens``; return rlkit sequences and the decoded (billed) count.

    A sequence the service ended on its own within ``max_tokens`` keeps its stop reason; one that
    was cut is ``"length"``, exactly what a ``max_tokens`` request would report."""
    out: List[SampledSequence] = []
    billed = 0
    for s in sequences:
        tokens = list(_get(s, "tokens"))
        logprobs = _get(s, "logprobs")
        reason = _get(s, "stop_reason")
        reason = getattr(reason, "value", reason)
        billed += len(tokens)
        if len(tokens) > max_tokens:
            tokens = tokens[:max_tokens]
            logprobs = list(logprobs)[:max_tokens] if logprobs is not None else None
            reason = StopReason.LENGTH.value
        out.append(SampledSequence(stop_reason=StopReason(reason), tokens=tokens, logprobs=list(logprobs) if logprobs is not None else None))
    return out, billed


def topk_to_rlkit(raw: Optional[Sequence[Any]], n_prompt: int) -> Optional[List[Optional[List[TokenLogprob]]]]:
    if raw is None:
        return None
    out: List[Optional[List[TokenLogprob]]] = []
    for pos in raw:
        if pos is None:
            out.append(None)
        else:
            out.append([TokenLogprob(token_id=int(_get(t, "token_id")), logprob=float(_get(t, "logprob"))) for t in pos])
    return prompt_logprobs_to_rlkit(out, n_prompt)


def _get(obj: Any, name: str) -> Any:
    """Read ``name`` from an SDK pydantic object or a wire dict (camelCase)."""
    if isinstance(obj, Mapping):
        camel = {"stop_reason": "stopReason", "token_id": "tokenId"}.get(name, name)
        return obj.get(camel, obj.get(name))
    return getattr(obj, name)
