"""Tinker's wire formats <-> rlkit's types, for the Tinker-compatible server.

Requests arrive as the SDK sends them: ``/api/v1/forward_backward`` as a protobuf
``tinker_public.ForwardBackwardRequest`` (optionally zstd-compressed), everything else as JSON.
Results of ``forward_backward`` and ``asample`` go back as protobuf (``ForwardBackwardOutput``,
``SampleResponse``; the SDK has had no JSON fallback for them since 0.25), the rest as the JSON
of the SDK's pydantic response models.

What rlkit's engine cannot take is refused here with one line naming what and where: image and
audio chunks (the engine is text-only), tensors of more than one dimension (top-k distillation
targets), and stop conditions or sampling options the local sampler does not implement.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from rlkit.errors import InvalidInputError
from rlkit.types import Datum, ForwardBackwardOutput, ModelInput, SampleResponse, SamplingParams, StopReason, TensorData

_PB = None


def pb():
    """The SDK's generated protobuf module (``tinker.proto.tinker_public_pb2``)."""
    global _PB
    if _PB is None:
        from tinker.proto import tinker_public_pb2

        _PB = tinker_public_pb2
    return _PB


# -- requests ---------------------------------------------------------------------------------------


def _chunk_tokens(kind: Optional[str], where: str) -> None:
    if kind in ("image", "image_asset_pointer"):
        raise InvalidInputError(f"{where}: image chunks are not supported (rlkit's local engine is text-only)")
    if kind == "dmel":
        raise InvalidInputError(f"{where}: audio (dmel) chunks are not supported (rlkit's local engine is text-only)")
    if kind not in (None, "encoded_text"):
        raise InvalidInputError(f"{where}: chunk type {kind!r} is not supported (text only)")


def json_model_input(value: Any, where: str) -> List[int]:
    """Token ids of a JSON ``ModelInput`` (``{"chunks": [{"type": "encoded_text", "tokens": [...]}]}``)."""
    if not isinstance(value, dict) or not isinstance(value.get("chunks"), list):
        raise InvalidInputError(f"{where}: expected a ModelInput object with a 'chunks' list")
    tokens: List[int] = []
    for i, chunk in enumerate(value["chunks"]):
        if not isinstance(chunk, dict):
            raise InvalidInputError(f"{where}.chunks[{i}]: expected an object")
        _chunk_tokens(chunk.get("type"), f"{where}.chunks[{i}]")
        ids = chunk.get("tokens", [])
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise InvalidInputError(f"{where}.chunks[{i}].tokens: expected a list of non-negative integer token ids")
        tokens.extend(ids)
    return tokens


def _tensor(msg: Any, where: str) -> np.ndarray:
    p = pb()
    dtype = {p.DTYPE_FLOAT32: np.float32, p.DTYPE_INT64: np.int64, p.DTYPE_INT32: np.int32}.get(msg.dtype)
    if dtype is None:
        raise InvalidInputError(f"{where}: unsupported tensor dtype {msg.dtype}")
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):
        if len(shape) != 2:
            raise InvalidInputError(f"{where}: a sparse tensor needs a 2-D shape, got {shape}")
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(csr.col_indices, dtype=np.int64)
        dense = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            dense[row, col[crow[row] : crow[row + 1]]] = values[crow[row] : crow[row + 1]]
        array = dense
    else:
        array = np.frombuffer(msg.dense, dtype=dtype)
        if shape:
            array = array.reshape(shape)
    if array.ndim > 1 and not (array.ndim == 2 and array.shape[1] == 1):
        raise InvalidInputError(
            f"{where}: shape {list(array.shape)} is not supported; rlkit's engine takes one value per token "
            "(no top-k / distribution targets)"
        )
    return array.reshape(-1)


def forward_backward_request(body: bytes) -> Dict[str, Any]:
    """Parse a ``ForwardBackwardRequest`` protobuf into ``{model_id, seq_id, loss_fn, config, forward_only, datums}``.

    ``datums`` is a list of rlkit :class:`Datum`; a datum the engine cannot take raises
    :class:`InvalidInputError` when ``datums()`` is called (the operation fails in order)."""
    from google.protobuf.message import DecodeError

    msg = pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError):
        raise InvalidInputError("forward_backward: the body is not a ForwardBackwardRequest protobuf (truncated or corrupt)") from None
    config: Dict[str, Any] = {}
    for key, value in msg.loss_fn_config.items():
        config[key] = float(value)
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)

    def datums() -> List[Datum]:
        out = []
        for i, d in enumerate(msg.data):
            tokens: List[int] = []
            for j, chunk in enumerate(d.model_input):
                kind = chunk.WhichOneof("chunk")
                _chunk_tokens(kind, f"forward_backward: datum[{i}].model_input[{j}]")
                tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
            # provenance spans (which sampled sequence each position came from) only matter to
            # stable_reinforce, which is refused; tinker-cookbook's RL loop sends them with every loss
            inputs = {}
            for key, tensor in d.loss_fn_inputs.items():
                array = _tensor(tensor, f"forward_backward: datum[{i}].loss_fn_inputs[{key!r}]")
                dtype = "int64" if array.dtype.kind in "iu" else "float32"
                inputs[key] = TensorData(data=array.tolist(), dtype=dtype)
            out.append(Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs=inputs))
        return out

    return {
        "model_id": msg.model_id,
        "seq_id": int(msg.seq_id),
        "loss_fn": msg.loss_fn,
        "config": config,
        "forward_only": bool(msg.forward_only),
        "datums": datums,
        "n_data": len(msg.data),
    }


def sampling_params(
    raw: Dict[str, Any], where: str, default_max_tokens: int = 1024
) -> tuple[SamplingParams, Optional[List[int]]]:
    """rlkit :class:`SamplingParams` and the stop token ids of a Tinker ``SamplingParams`` JSON.

    Tinker's ``stop``: ``None`` keeps the model's end-of-turn tokens; a list of token ids
    replaces them; ``[]`` disables every stop token (generation runs to ``max_tokens``); text
    stops are matched on the decoded completion, the end-of-turn tokens still stop. Every value is
    type- and range-checked (``max_tokens`` absent: ``default_max_tokens``)."""
    from rlkit.backends.tinker.server import checks

    unknown = sorted(set(raw) - {"max_tokens", "temperature", "top_k", "top_p", "seed", "stop"})
    if unknown:
        raise InvalidInputError(f"{where}: unknown fields {unknown}")
    stop = raw.get("stop")
    stop_text: Optional[List[str]] = None
    stop_ids: Optional[List[int]] = None
    if isinstance(stop, str):
        stop_text = [stop]
    elif isinstance(stop, list):
        if all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in stop):
            stop_ids = [int(s) for s in stop]
        elif all(isinstance(s, str) for s in stop):
            stop_text = list(stop)
        else:
            raise InvalidInputError(f"{where}.stop: mix of token ids and strings")
    elif stop is not None:
        raise InvalidInputError(f"{where}.stop: expected text, a list of texts or a list of token ids")
    top_k = checks.optional_integer(raw.get("top_k"), f"{where}.top_k", -1)
    top_p = raw.get("top_p")
    top_p = None if top_p is None else checks.number(top_p, f"{where}.top_p", 0.0, 1.0)
    temperature = raw.get("temperature")
    max_tokens = checks.optional_integer(raw.get("max_tokens"), f"{where}.max_tokens", 1)
    params = SamplingParams(
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=1.0 if temperature is None else checks.number(temperature, f"{where}.temperature", 0.0),
        top_k=None if top_k in (None, -1, 0) else top_k,
        top_p=None if top_p in (None, 1.0) else top_p,
        seed=checks.seed(raw.get("seed"), f"{where}.seed"),
        stop=stop_text,
    )
    return params, stop_ids


# -- results ----------------------------------------------------------------------------------------


def wire_metrics(metrics: Dict[str, float]) -> Dict[str, float]:
    """Metric keys as the SDK reduces them: ``name:reduction`` with a reduction it knows
    (``mean``, ``sum``, ``min``, ``max``). rlkit's ``tokens:train`` becomes ``tokens_train:sum``."""
    out: Dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            continue
        name, _, reduction = key.rpartition(":")
        if not name:
            name, reduction = key, "mean"
        name = name.replace(":", "_")
        if reduction not in ("mean", "sum", "min", "max"):
            name, reduction = f"{name}_{reduction}", "sum"
        out[f"{name}:{reduction}"] = float(value)
    return out


def forward_backward_output(out: ForwardBackwardOutput) -> bytes:
    """A ``ForwardBackwardOutput`` protobuf: one ArrayRecord with a ``logprobs`` field per datum."""
    p = pb()
    msg = p.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in wire_metrics(out.metrics).items():
        msg.metrics[key] = value
    arrays = [
        np.asarray(o["logprobs"].to_torch().float().numpy(), dtype=np.float32).reshape(-1) for o in out.loss_fn_outputs
    ]
    record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(arrays))
    if arrays:
        offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype(np.int64)
        field = record.fields["logprobs"]
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = offsets.tobytes()
        field.dtype = p.DTYPE_FLOAT32
    return msg.SerializeToString()


def sample_response(resp: SampleResponse, prompt_len: int, last_n: Optional[int] = None) -> bytes:
    """A ``SampleResponse`` protobuf (NaN where a prompt position has no logprob)."""
    p = pb()
    msg = p.SampleResponse()
    for seq in resp.sequences:
        s = msg.sequences.add()
        s.stop_reason = p.STOP_REASON_STOP if seq.stop_reason == StopReason.STOP else p.STOP_REASON_LENGTH
        s.tokens = np.asarray(seq.tokens, dtype=np.int32).tobytes()
        if seq.logprobs is not None:
            s.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    hidden = prompt_len - last_n if last_n else 0  # positions before the last n are not scored
    if resp.prompt_logprobs is not None:
        values = [math.nan if (v is None or i < hidden) else v for i, v in enumerate(resp.prompt_logprobs)]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    if resp.topk_prompt_logprobs is not None:
        rows: Sequence[Any] = resp.topk_prompt_logprobs
        k = max((len(r) for r in rows if r), default=0)
        ids = np.zeros((len(rows), k), dtype=np.int32)
        lps = np.full((len(rows), k), -99999.0, dtype=np.float32)
        for i, row in enumerate(rows):
            for j, item in enumerate(row or []):
                if i >= hidden:
                    ids[i, j], lps[i, j] = item.token_id, item.logprob
        msg.topk_prompt_logprobs.token_ids = ids.tobytes()
        msg.topk_prompt_logprobs.logprobs = lps.tobytes()
        msg.topk_prompt_logprobs.k = k
        msg.topk_prompt_logprobs.length = len(rows)
    return msg.SerializeToString()
