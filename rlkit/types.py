"""Plain data types of the training-session API.

Field names, defaults and validation follow ``sagemaker.train.training_session.types``
(sagemaker-train 1.27.0) so that loop code written for SageMaker runs on the local backend
unchanged, and vice versa. rlkit does not need the SDK installed for any of this.

Unknown fields are rejected (``AdamParams(learning_rte=...)`` fails at construction), and every
validation failure is an :class:`~rlkit.errors.InvalidInputError` with a one-line message naming
the type, the field and the value.

Per-token loss inputs (``Datum.loss_fn_inputs``) carry exactly one value per token of the datum's
``model_input``, prompt included; position *i* predicts token *i+1*.

The SDK's enum of built-in loss names, ``LossFunction``, is not here: it is derived from the loss
classes that declare the built-ins (``rlkit.losses.LossFunction``, also ``rlkit.LossFunction``), and
this module imports nothing above it.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from rlkit.errors import InvalidInputError

__all__ = [
    "GREEDY_TEMPERATURE",
    "cost_metrics",
    "AdamParams",
    "Constraint",
    "Datum",
    "EncodedTextChunk",
    "ForwardBackwardOutput",
    "LoadStateResponse",
    "ModelInput",
    "OptimStepResponse",
    "SampledSequence",
    "SampleResponse",
    "SamplingParams",
    "SaveStateResponse",
    "SaveWeightsResponse",
    "StopReason",
    "TensorData",
    "TensorDtype",
    "TokenLogprob",
    "TokenUsage",
]


#: sampling temperatures below this are greedy, like 0 (``logits / 1e-45`` overflows float32)
GREEDY_TEMPERATURE = 1e-6


def _one_line(cls_name: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e.get("loc", ())) or "(value)"
        value = e.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        if len(shown) > 60:
            shown = shown[:57] + "..."
        message = str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{cls_name}.{loc}={shown}: {message}")
    return "; ".join(parts)


class _Strict(BaseModel):
    """Base of customer-authored types: unknown fields rejected, one-line errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise InvalidInputError(_one_line(type(self).__name__, err)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as err:
            raise InvalidInputError(_one_line(type(self).__name__, err)) from None

    @classmethod
    def coerce(cls, value: Any, where: str) -> Any:
        """``value`` as this type: ``None`` -> the defaults, a dict -> validated fields."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise InvalidInputError(f"{where}: expected {cls.__name__} or a dict, got {type(value).__name__}")


def _is_number(value: Any, *, integer: bool = False) -> bool:
    """A plain number (bools and numpy/torch scalars count); with ``integer``, a whole one."""
    if isinstance(value, (bool, int)):
        return True
    if isinstance(value, str) or not hasattr(value, "__float__"):
        return False
    if not integer or hasattr(value, "__index__"):  # a numpy/torch integer scalar is whole
        return True
    number = float(value)
    return math.isfinite(number) and number.is_integer()


class TensorDtype(str, Enum):
    """Element type of a :class:`TensorData` (the dtypes the service accepts)."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT32 = "int32"
    INT64 = "int64"


_TORCH_DTYPES = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int32": "int32",
    "int64": "int64",
}


class TensorData(_Strict):
    """A flat tensor with dtype and optional shape, used for ``loss_fn_inputs``.

    Build from a list (``TensorData(data=[...])``) or a tensor (``TensorData.from_torch(t)``);
    a tensor is kept as-is and only turned into a list when :attr:`data` is read.
    """

    dtype: TensorDtype = TensorDtype.FLOAT32
    shape: Optional[List[int]] = None
    _list: Optional[List[Any]] = PrivateAttr(default=None)
    _tensor: Any = PrivateAttr(default=None)

    def __init__(self, data: Any = None, **kwargs: Any) -> None:
        if data is None:
            raise InvalidInputError("TensorData requires 'data'")
        super().__init__(**kwargs)
        if isinstance(data, (list, tuple)):
            bad = next((i for i, value in enumerate(data) if not _is_number(value)), None)
            if bad is not None:
                shown = repr(data[bad]) if len(repr(data[bad])) <= 40 else repr(data[bad])[:37] + "..."
                raise InvalidInputError(f"TensorData.data[{bad}]={shown}: not a number")
            self._list = list(data)
        elif hasattr(data, "detach") or hasattr(data, "tolist"):
            self._tensor = data
        else:
            raise InvalidInputError(f"TensorData.data must be a list or a tensor, got {type(data).__name__}")

    @property
    def data(self) -> List[Any]:
        """The values as a flat list."""
        if self._list is None:
            raw = self._tensor.reshape(-1).tolist()
            self._list = raw if isinstance(raw, list) else [raw]
        return self._list

    def __len__(self) -> int:
        if self._tensor is not None and self._list is None:
            return int(self._tensor.numel()) if hasattr(self._tensor, "numel") else len(self.data)
        return len(self.data)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, TensorData):
            return NotImplemented
        return self.data == other.data and self.dtype == other.dtype and self.shape == other.shape

    @classmethod
    def from_torch(cls, tensor: Any) -> "TensorData":
        """Wrap a torch tensor (kept lazily; dtype taken from the tensor)."""
        name = str(tensor.dtype).replace("torch.", "")
        if name not in _TORCH_DTYPES:
            name = "float32" if tensor.is_floating_point() else "int64"
        shape = list(tensor.shape) if tensor.dim() > 1 else None
        return cls(data=tensor.detach().cpu(), dtype=TensorDtype(name), shape=shape)

    @classmethod
    def from_numpy(cls, array: Any) -> "TensorData":
        """Wrap a numpy array."""
        import numpy as np

        kind = "float32" if np.issubdtype(array.dtype, np.floating) else "int64"
        shape = list(array.shape) if array.ndim > 1 else None
        return cls(data=array.reshape(-1).tolist(), dtype=TensorDtype(kind), shape=shape)

    def to_torch(self) -> Any:
        """The values as a ``torch.Tensor`` of this dtype (and shape, when set)."""
        import torch

        dtype = getattr(torch, _TORCH_DTYPES[self.dtype.value])
        if self._tensor is not None and isinstance(self._tensor, torch.Tensor):
            t = self._tensor.to(dtype)
        else:
            t = torch.tensor(self.data, dtype=dtype)
        return t.reshape(self.shape) if self.shape is not None else t.reshape(-1)

    def to_torch_uncast(self) -> Any:
        """The values as given, as a flat float64 tensor: not cast to :attr:`dtype` (so a 1.5 in
        an int64 TensorData is still 1.5, for validation)."""
        import torch

        if self._tensor is not None and isinstance(self._tensor, torch.Tensor):
            return self._tensor.detach().reshape(-1).to(torch.float64)
        return torch.tensor(self.data, dtype=torch.float64).reshape(-1)

    def tolist(self) -> List[Any]:
        """The values as a plain flat list."""
        return self.data

    def model_dump_wire(self) -> Dict[str, Any]:
        """The runtime wire shape ``{"data", "dtype"[, "shape"]}``."""
        d: Dict[str, Any] = {"data": self.data, "dtype": self.dtype.value}
        if self.shape is not None:
            d["shape"] = self.shape
        return d


class EncodedTextChunk(_Strict):
    """A run of token ids."""

    tokens: List[int]

    @property
    def length(self) -> int:
        return len(self.tokens)


class ModelInput(_Strict):
    """A model input: a list of token chunks (only encoded text today)."""

    chunks: List[EncodedTextChunk] = Field(default_factory=list)

    @classmethod
    def from_ints(cls, tokens: Sequence[int]) -> "ModelInput":
        """One chunk holding ``tokens``."""
        return cls(chunks=[EncodedTextChunk(tokens=[int(t) for t in tokens])])

    @classmethod
    def empty(cls) -> "ModelInput":
        return cls(chunks=[])

    def to_ints(self) -> List[int]:
        """All chunks' tokens, flattened."""
        out: List[int] = []
        for chunk in self.chunks:
            out.extend(chunk.tokens)
        return out

    @property
    def length(self) -> int:
        return sum(chunk.length for chunk in self.chunks)

    def append(self, chunk: EncodedTextChunk) -> "ModelInput":
        """A new input with ``chunk`` appended (this one is unchanged)."""
        return ModelInput(chunks=[*self.chunks, chunk])

    def append_int(self, token: int) -> "ModelInput":
        """A new input with one token appended."""
        return self.append(EncodedTextChunk(tokens=[int(token)]))


class Datum(_Strict):
    """One training example: a model input and its per-token loss inputs.

    ``loss_fn_inputs`` values may be :class:`TensorData`, tensors or plain lists; each holds one
    value per token of ``model_input``.
    """

    model_input: ModelInput
    loss_fn_inputs: Dict[str, Any] = Field(default_factory=dict)

    @field_validator("loss_fn_inputs", mode="before")
    @classmethod
    def _wrap_inputs(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError("loss_fn_inputs must be a dict of name -> values")
        out = {}
        for key, item in value.items():
            if isinstance(item, TensorData):
                out[key] = item
            elif hasattr(item, "detach"):
                out[key] = TensorData.from_torch(item)
            elif isinstance(item, (list, tuple)):
                is_int = key == "target_tokens"
                bad = next((j for j, v in enumerate(item) if not _is_number(v, integer=is_int)), None)
                if bad is not None:
                    kind = "a token id (an integer)" if is_int else "a number"
                    raise ValueError(f"loss_fn_inputs[{key!r}][{bad}]={item[bad]!r} is not {kind}")
                out[key] = TensorData(data=list(item), dtype=TensorDtype.INT64 if is_int else TensorDtype.FLOAT32)
            elif isinstance(item, dict) and "data" in item:
                out[key] = TensorData(data=item["data"], dtype=item.get("dtype", "float32"), shape=item.get("shape"))
            else:
                raise ValueError(f"loss_fn_inputs[{key!r}] must be a list, tensor or TensorData")
        return out

    @property
    def length(self) -> int:
        return self.model_input.length


class AdamParams(_Strict):
    """Adam(W) hyper-parameters for one ``optim_step`` (decoupled weight decay).

    ``lora_plus_lr_ratio`` multiplies the learning rate of LoRA B matrices (LoRA+, Hayou et al.
    2024, arXiv:2402.12354). ``grad_clip_norm`` clips the global gradient norm before the step.
    Every value must be finite and within its range (a negative or infinite learning rate is
    refused here, before it reaches the weights).
    """

    model_config = ConfigDict(allow_inf_nan=False)  # one inf/nan step poisons the weights for good

    learning_rate: float = Field(default=1e-4, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.999, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    grad_clip_norm: Optional[float] = Field(default=None, gt=0)
    lora_plus_lr_ratio: Optional[float] = Field(default=None, gt=0)


class Constraint(_Strict):
    """What sampled text must match (constrained decoding, :mod:`rlkit.constraints`): exactly one of
    ``json_schema`` (a JSON schema; the text is one JSON value fitting it, written compactly as
    ``json.dumps`` writes it), ``lark`` (a Lark grammar in llguidance's dialect, which may embed a
    JSON schema as ``%json {...}``) or ``regex`` (a regular expression the whole text matches).

    The sampler masks, at each step, every token that would leave the language; a sample ends once
    the text is complete (with the end-of-turn token where the grammar allows it). The reported
    logprobs are not renormalised over the allowed tokens (like ``top_p`` / ``top_k``), so a trainer
    scoring at the same temperature reproduces them exactly.
    """

    json_schema: Optional[Dict[str, Any]] = None
    lark: Optional[str] = None
    regex: Optional[str] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "Constraint":
        given = [k for k in ("json_schema", "lark", "regex") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of json_schema, lark, regex (got {', '.join(given) or 'none'})")
        if self.lark is not None and not self.lark.strip() or self.regex == "":
            raise ValueError("the grammar is empty")
        return self


class SamplingParams(_Strict):
    """Decoding parameters.

    ``temperature`` 0 (or None with top_k=1) is greedy, and so is any temperature below
    :data:`GREEDY_TEMPERATURE` (1e-6; ``1e-45`` would overflow the logits): the sampled logprobs
    are then the greedy ones, at T = 1. ``top_k`` -1 or None is off; ``stop`` is text matched on the
    decoded completion. Values must be finite. The managed service requires ``max_tokens`` >= 512;
    the local backend accepts any positive value. ``constraint`` (a :class:`Constraint` or its dict)
    restricts the text to a grammar or JSON schema; only engines whose capabilities say
    ``constrained_decoding`` (local) accept it.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    max_tokens: int = Field(default=512, gt=0)
    temperature: Optional[float] = Field(default=None, ge=0)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    top_k: Optional[int] = None
    seed: Optional[int] = None
    stop: Optional[List[str]] = None
    #: constrained decoding (an rlkit extension, not in the SageMaker SDK): engines without it refuse it
    constraint: Optional[Constraint] = None

    @field_validator("stop", mode="before")
    @classmethod
    def _coerce_stop(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        if isinstance(value, (list, tuple)):
            if any(not isinstance(v, str) for v in value):
                raise ValueError("stop takes text sequences, not token ids")
            if any(v == "" for v in value):
                raise ValueError("stop sequences must be non-empty")
        return value

    @field_validator("top_k")
    @classmethod
    def _check_top_k(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be >= 1, or -1 to disable")
        return value

    @property
    def greedy(self) -> bool:
        """Whether these parameters decode greedily: ``temperature`` (``None`` = 1) below
        :data:`GREEDY_TEMPERATURE`, or ``top_k`` 1."""
        temperature = 1.0 if self.temperature is None else self.temperature
        return temperature < GREEDY_TEMPERATURE or self.top_k == 1


class StopReason(str, Enum):
    """Why a sampled sequence ended: a stop sequence / end-of-turn token, or ``max_tokens``."""

    STOP = "stop"
    LENGTH = "length"


class TokenUsage(_Strict):
    """Tokens an operation processed (the managed service bills per token).

    ``prefill_tokens``: prompt tokens run through the model once (shared by a group);
    ``decode_tokens``: tokens sampled; ``train_tokens``: tokens in forward/backward passes.
    """

    prefill_tokens: int = 0
    decode_tokens: int = 0
    train_tokens: int = 0

    def __add__(self, other: "TokenUsage") -> "TokenUsage":
        return TokenUsage(
            prefill_tokens=self.prefill_tokens + other.prefill_tokens,
            decode_tokens=self.decode_tokens + other.decode_tokens,
            train_tokens=self.train_tokens + other.train_tokens,
        )


class SampledSequence(_Strict):
    """One sampled completion: its tokens and their log-probabilities under the sampling
    distribution (temperature applied)."""

    stop_reason: StopReason
    tokens: List[int]
    logprobs: Optional[List[float]] = None


class TokenLogprob(_Strict):
    token_id: int
    logprob: float


class SampleResponse(_Strict):
    """The result of ``sample``: ``num_samples`` sequences, optional prompt logprobs, usage."""

    sequences: List[SampledSequence]
    prompt_logprobs: Optional[List[Optional[float]]] = None
    topk_prompt_logprobs: Optional[List[Optional[List[TokenLogprob]]]] = None
    usage: TokenUsage = Field(default_factory=TokenUsage)


class ForwardBackwardOutput(_Strict):
    """The result of ``forward_backward`` / ``forward``.

    ``loss_fn_outputs[i]["logprobs"]`` holds the trainer's per-token logprobs of datum *i*;
    ``metrics`` is a flat dict (``loss:sum``, ``tokens:train``, loss diagnostics).
    """

    loss_fn_output_type: str = "TensorData"
    loss_fn_outputs: List[Dict[str, TensorData]] = Field(default_factory=list)
    metrics: Dict[str, float] = Field(default_factory=dict)
    usage: TokenUsage = Field(default_factory=TokenUsage)


#: Metric prefixes a backend reports about what an operation cost and where its numbers came from.
COST_METRIC_PREFIXES = ("billing/", "logprobs:")


def cost_metrics(metrics: Dict[str, float]) -> Dict[str, float]:
    """The backend's cost and provenance metrics of one result (``billing/*``: the session's bill;
    ``logprobs:*``: whether the trainer's logprobs came from the service or were scored, and the
    tokens that cost), with a ``backend/`` prefix (the linearised path's) removed; loops log them."""
    out = {}
    for key, value in metrics.items():
        bare = key[len("backend/"):] if key.startswith("backend/") else key
        if bare.startswith(COST_METRIC_PREFIXES):
            out[bare] = float(value)
    return out


class OptimStepResponse(_Strict):
    """The result of ``optim_step``: metrics such as ``grad_norm`` and ``learning_rate``."""

    metrics: Dict[str, float] = Field(default_factory=dict)


class _SaveResponse(_Strict):
    model_package_arn: str

    @property
    def path(self) -> str:
        """The checkpoint id (Tinker's name for :attr:`model_package_arn`)."""
        return self.model_package_arn

    @property
    def checkpoint_id(self) -> str:
        return self.model_package_arn


class SaveStateResponse(_SaveResponse):
    """``save_state`` result: the id of a checkpoint holding adapter + optimizer."""


class SaveWeightsResponse(_SaveResponse):
    """``save_weights_for_sampler`` result: the id of an adapter-only checkpoint."""


class LoadStateResponse(_Strict):
    """``load_state`` result; resolving the future is the signal that the state was loaded."""

    model_package_arn: Optional[str] = None
