"""The ``Loss`` base: ``loss(data, logprobs) -> (scalar, metrics)``.

The call signature is Tinker's custom-loss signature, so research code ports both ways:

- ``data``: the batch's :class:`~rlkit.types.Datum` objects (per-token ``loss_fn_inputs``);
- ``logprobs``: one 1-D tensor per datum, ``logprobs[i][t] = log p(target_tokens[t] | tokens[:t+1])``
  under the trainer, with gradient when training.

It returns the scalar to minimise and a flat metrics dict. Metric names follow the session's
suffix convention: ``name:sum`` values add up across micro-batches, ``name:mean`` values are
averaged by the number of weighted tokens (``tokens:weighted``).

**Native or linearised: one rule.** A loss runs as a backend built-in (one ``forward_backward``
by name) only when it *is* that built-in: its class declares ``builtin = "<name>"`` in its own
body. ``builtin`` is never inherited (:meth:`Loss.__init_subclass__` resets it), so a research
subclass of :class:`~rlkit.losses.PPO` that overrides :meth:`~Loss.compute` runs its own maths
through the linearised path on every backend, with no extra line. A subclass that wants the
built-in on purpose (say, PPO with other default bounds) declares ``builtin`` again.

**Promises, not defaults.** ``datum_separable`` (the loss is a sum of independent per-datum terms,
so a backend may split the batch into micro-batches) and ``linear_in_weights`` (the loss is linear
in the per-token ``weights``, so an aggregation can be compiled into them) are ``False`` unless a
loss states them; the built-ins do. A user loss that says nothing is computed over the whole
batch at once, with the aggregation applied around its value (:mod:`rlkit.losses.aggregation`).

Every hook a subclass may override is declared on :class:`Loss` with a safe default:
:meth:`~Loss.compute`, :meth:`~Loss.validate_batch`, :meth:`~Loss.builtin_config`,
:meth:`~Loss.native_call`, :meth:`~Loss.native_data`, :meth:`~Loss.aggregation_units`, and the
class attributes ``name``, ``required_inputs``, ``optional_inputs``, ``datum_separable``,
``linear_in_weights``, ``allowed_aggregations``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch

from rlkit.errors import InvalidInputError
from rlkit.types import GREEDY_TEMPERATURE, Datum, TensorData

Metrics = Dict[str, float]


def datum_input(datum: Datum, key: str, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The per-token loss input ``key`` of ``datum`` as a 1-D tensor."""
    value = datum.loss_fn_inputs[key]
    tensor = value.to_torch() if isinstance(value, TensorData) else torch.as_tensor(value)
    return tensor.reshape(-1).to(dtype)


def batch_input(data: Sequence[Datum], key: str, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``datum_input`` of every datum, concatenated."""
    return torch.cat([datum_input(d, key, dtype=dtype) for d in data]) if data else torch.zeros(0, dtype=dtype)


class NativeCall(NamedTuple):
    """A built-in ``forward_backward(data, name, loss_fn_config=config)`` that *is* a loss."""

    name: str
    config: Optional[Dict[str, float]]


class Loss:
    """Base class of loss modules (see the module docstring for the native rule and the hooks).

    Subclasses set ``name`` (metrics namespace) and ``required_inputs`` and implement
    :meth:`compute`. Everything else has a safe default.
    """

    #: metrics namespace, and the name used in error messages
    name: ClassVar[str] = "loss"
    #: the backend built-in this class *is*; declared in a class body, never inherited
    builtin: ClassVar[Optional[str]] = None
    #: the ``loss_fn_config`` keys the built-in accepts (constructor arguments of the same names)
    builtin_config_keys: ClassVar[Tuple[str, ...]] = ()
    #: per-token ``loss_fn_inputs`` every datum must carry / may carry
    required_inputs: ClassVar[Tuple[str, ...]] = ("target_tokens", "weights")
    optional_inputs: ClassVar[Tuple[str, ...]] = ("temperature",)
    #: promise: a sum of independent per-datum terms (a backend may split the batch)
    datum_separable: ClassVar[bool] = False
    #: promise: linear in ``weights`` (an aggregation may be compiled into them)
    linear_in_weights: ClassVar[bool] = False
    #: the aggregation modes that make sense around this loss (see rlkit.losses.aggregation)
    allowed_aggregations: ClassVar[Tuple[str, ...]] = ("sum", "token_mean", "seq_mean", "constant")
    #: the call a built-in object was built from: set only by :func:`rlkit.losses.builtin.builtin_loss`
    #: (declared, not defaulted; read with ``getattr(loss, "_builtin_call", None)``)
    _builtin_call: Optional[NativeCall]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "builtin" not in cls.__dict__:  # a subclass is a different loss unless it says otherwise
            cls.builtin = None

    # -- what subclasses implement ----------------------------------------------------------------
    def compute(self, data: Sequence[Datum], logprobs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, Metrics]:
        """The scalar to minimise and its metrics (``logprobs``: one tensor per datum, ``[T_i]``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute(data, logprobs)")

    def validate_batch(self, data: Sequence[Datum]) -> None:
        """Checks across datums (pairing, non-empty sequences); per-datum inputs are already checked."""

    def builtin_config(self) -> Optional[Dict[str, float]]:
        """The ``loss_fn_config`` sent with :attr:`builtin`: this object's values of
        :attr:`builtin_config_keys` (``None`` when the built-in takes no config)."""
        return {key: float(getattr(self, key)) for key in self.builtin_config_keys} or None

    def native_call(self) -> Optional[NativeCall]:
        """The built-in call this loss is, or ``None`` to run linearised. Default: the class's own
        ``builtin`` with :meth:`builtin_config`; override to return ``None`` for options the
        built-in does not have (PPO's dual clip, off-policy corrections)."""
        builtin = type(self).builtin
        if builtin is None:
            return None
        return NativeCall(builtin, self.builtin_config())

    def native_data(self, data: Sequence[Datum]) -> List[Datum]:
        """The batch as the built-in expects it (default: unchanged; a loss that compiles to
        another built-in, like reverse-KL distillation to ``importance_sampling``, rewrites it)."""
        return list(data)

    def aggregation_units(self, data: Sequence[Datum]) -> int:
        """How many units ``seq_mean`` averages over when applied around this loss (default:
        the number of datums; DPO: the number of pairs)."""
        return len(data)

    # -- the call ---------------------------------------------------------------------------------
    def __call__(self, data: Sequence[Datum], logprobs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, Metrics]:
        if len(data) != len(logprobs):
            raise InvalidInputError(f"{self.name}: {len(data)} datums but {len(logprobs)} logprob tensors")
        for i, (datum, lp) in enumerate(zip(data, logprobs)):
            if lp.numel() != datum.model_input.length:
                raise InvalidInputError(
                    f"{self.name}: datum[{i}] has {datum.model_input.length} tokens but {lp.numel()} logprobs"
                )
        value, metrics = self.compute(data, logprobs)
        return value, metrics

    def validate(self, data: Sequence[Datum], *, vocab_size: Optional[int] = None) -> None:
        """Refuse a batch this loss cannot use, naming the datum and key (before any work)."""
        validate_inputs(data, self.required_inputs, self.optional_inputs, loss_name=self.name, vocab_size=vocab_size)
        self.validate_batch(data)

    # -- composition ------------------------------------------------------------------------------
    def __add__(self, other: "Loss") -> "Loss":
        if not isinstance(other, Loss):
            return NotImplemented
        return CompositeLoss([(1.0, self), (1.0, other)])

    def __mul__(self, weight: float) -> "Loss":
        if not isinstance(weight, (int, float)):
            return NotImplemented
        return CompositeLoss([(float(weight), self)])

    __rmul__ = __mul__

    def __repr__(self) -> str:
        fields = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        inner = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        return f"{type(self).__name__}({inner})"


class CompositeLoss(Loss):
    """``sum_k w_k * L_k``; each part's metrics keep their own namespace."""

    name = "composite"
    #: ``(weight, loss)`` terms, flat (no part is itself a CompositeLoss)
    parts: List[Tuple[float, Loss]]

    def __init__(self, parts: List[Tuple[float, Loss]]):
        flat: List[Tuple[float, Loss]] = []
        for weight, part in parts:
            if isinstance(part, CompositeLoss):
                flat.extend((weight * w, p) for w, p in part.parts)
            else:
                flat.append((weight, part))
        self.parts = flat

    @property
    def datum_separable(self) -> bool:  # type: ignore[override]
        return all(p.datum_separable for _, p in self.parts)

    @property
    def required_inputs(self) -> Tuple[str, ...]:  # type: ignore[override]
        return tuple(sorted({k for _, p in self.parts for k in p.required_inputs}))

    @property
    def optional_inputs(self) -> Tuple[str, ...]:  # type: ignore[override]
        return tuple(sorted({k for _, p in self.parts for k in p.optional_inputs} - set(self.required_inputs)))

    @property
    def linear_in_weights(self) -> bool:  # type: ignore[override]
        return all(p.linear_in_weights for _, p in self.parts)

    @property
    def allowed_aggregations(self) -> Tuple[str, ...]:  # type: ignore[override]
        return tuple(m for m in self.parts[0][1].allowed_aggregations if all(m in p.allowed_aggregations for _, p in self.parts))

    def aggregation_units(self, data: Sequence[Datum]) -> int:
        return self.parts[0][1].aggregation_units(data)

    def validate(self, data: Sequence[Datum], *, vocab_size: Optional[int] = None) -> None:
        names = " + ".join(p.name for _, p in self.parts)
        validate_inputs(data, self.required_inputs, self.optional_inputs, loss_name=names, vocab_size=vocab_size)
        for _, part in self.parts:
            part.validate_batch(data)

    def compute(self, data, logprobs):
        total = None
        metrics: Metrics = {}
        for weight, part in self.parts:
            value, part_metrics = part.compute(data, logprobs)
            total = weight * value if total is None else total + weight * value
            for key, v in part_metrics.items():
                metrics[key if key.startswith(part.name + "/") else f"{part.name}/{key}"] = v
        metrics["loss:sum"] = float(total.detach()) if total is not None else 0.0
        return total, metrics

    def __repr__(self) -> str:
        return " + ".join(f"{w:g} * {p!r}" for w, p in self.parts)


PER_TOKEN_INPUTS = ("target_tokens", "weights", "logprobs", "advantages", "temperature", "ref_logprobs", "teacher_logprobs")


def validate_inputs(
    data: Sequence[Datum],
    required: Sequence[str],
    optional: Sequence[str] = (),
    *,
    loss_name: str = "loss",
    vocab_size: Optional[int] = None,
) -> None:
    """Check every datum has exactly the ``required`` (+ ``optional``) per-token inputs, each one
    value per token, all finite, target tokens inside the vocabulary. Raises
    :class:`InvalidInputError` naming ``datum[i]`` and the key."""
    if not data:
        raise InvalidInputError(f"{loss_name}: empty batch")
    allowed = set(required) | set(optional)
    for i, datum in enumerate(data):
        if not isinstance(datum, Datum):
            raise InvalidInputError(f"{loss_name}: batch[{i}] is a {type(datum).__name__}, not a Datum")
        n = datum.model_input.length
        if n == 0:
            raise InvalidInputError(f"{loss_name}: datum[{i}] has no tokens")
        keys = set(datum.loss_fn_inputs)
        missing = [k for k in required if k not in keys]
        if missing:
            raise InvalidInputError(
                f"{loss_name}: datum[{i}] is missing loss_fn_inputs {missing} (needs {list(required)})"
            )
        extra = sorted(keys - allowed)
        if extra:
            raise InvalidInputError(
                f"{loss_name}: datum[{i}] has unexpected loss_fn_inputs {extra} (accepts {sorted(allowed)})"
            )
        for key in keys:
            value = datum.loss_fn_inputs[key]
            length = len(value)
            if length != n:
                raise InvalidInputError(
                    f"{loss_name}: datum[{i}].loss_fn_inputs[{key!r}] has {length} values for {n} tokens"
                )
            tensor = _uncast_input(datum, key, loss_name, i)
            if not bool(torch.isfinite(tensor).all()):
                bad = int((~torch.isfinite(tensor)).nonzero()[0])
                raise InvalidInputError(
                    f"{loss_name}: datum[{i}].loss_fn_inputs[{key!r}][{bad}] is {tensor[bad].item()} (not finite)"
                )
            if key == "target_tokens" and not bool((tensor == tensor.round()).all()):
                bad = int((tensor != tensor.round()).nonzero()[0])
                raise InvalidInputError(
                    f"{loss_name}: datum[{i}].loss_fn_inputs['target_tokens'][{bad}] is {tensor[bad].item()}, "
                    "not a token id (an integer)"
                )
            if key == "target_tokens" and vocab_size is not None:
                lo, hi = int(tensor.min()), int(tensor.max())
                if lo < 0 or hi >= vocab_size:
                    raise InvalidInputError(
                        f"{loss_name}: datum[{i}].loss_fn_inputs['target_tokens'] holds {lo if lo < 0 else hi}, "
                        f"outside the vocabulary [0, {vocab_size})"
                    )
            if key == "temperature" and bool((tensor < GREEDY_TEMPERATURE).any()):
                raise InvalidInputError(
                    f"{loss_name}: datum[{i}].loss_fn_inputs['temperature'] must be >= {GREEDY_TEMPERATURE:g} "
                    f"(got {tensor.min().item():g}; a greedy sample's logprobs are at T = 1: leave temperature out)"
                )


def _uncast_input(datum: Datum, key: str, loss_name: str, index: int) -> torch.Tensor:
    """``loss_fn_inputs[key]`` as given (float64, before any integer cast), or a one-line error."""
    value = datum.loss_fn_inputs[key]
    try:
        if isinstance(value, TensorData):
            return value.to_torch_uncast()
        return torch.as_tensor(value, dtype=torch.float64).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidInputError(f"{loss_name}: datum[{index}].loss_fn_inputs[{key!r}] is not numeric ({exc})") from None


def check_config(loss_name: str, config: Optional[Mapping[str, Any]], allowed: Mapping[str, float]) -> Dict[str, float]:
    """Merge ``config`` over defaults ``allowed``; refuse unknown keys and non-finite values."""
    out = dict(allowed)
    for key, value in (config or {}).items():
        if key not in allowed:
            raise InvalidInputError(
                f"{loss_name}: unknown loss_fn_config key {key!r} (accepts {sorted(allowed) or 'none'})"
            )
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise InvalidInputError(f"{loss_name}: loss_fn_config[{key!r}]={value!r} is not a number") from None
        if not math.isfinite(value):
            raise InvalidInputError(f"{loss_name}: loss_fn_config[{key!r}]={value} is not finite")
        out[key] = value
    return out


def check_ratio_bounds(loss_name: str, low: float, high: float) -> Tuple[float, float]:
    """Ratio clip bounds, which must satisfy 0 <= low < 1 < high, as floats."""
    if not (0.0 <= low < 1.0):
        raise InvalidInputError(f"{loss_name}: clip_low_threshold={low} must be in [0, 1) (a ratio bound, e.g. 0.8)")
    if not (high > 1.0):
        raise InvalidInputError(f"{loss_name}: clip_high_threshold={high} must be > 1 (a ratio bound, e.g. 1.2)")
    return float(low), float(high)
