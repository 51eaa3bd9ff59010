"""Aggregation: how per-token loss terms ``l_{i,t}`` (already multiplied by ``w_{i,t}``) become
one scalar. One place decides it, for every loss (cf. verl's ``agg_loss``):

- ``sum``:        ``sum_i sum_t l_it``                              (what the service built-ins do)
- ``token_mean``: ``sum_i sum_t l_it / sum_i n_i``                  (DAPO, Yu et al. 2025, arXiv:2503.14476)
- ``seq_mean``:   ``(1/N) sum_i (1/n_i) sum_t l_it``                (GRPO paper, Shao et al. 2024, arXiv:2402.03300)
- ``constant``:   ``sum_i sum_t l_it / C``                          (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783)

``n_i`` is the number of weighted tokens of sequence *i*, ``N`` the number of sequences and
``C`` a constant (Dr. GRPO uses the generation budget, e.g. ``max_tokens * N``).

For a loss linear in its weights these are the same as scaling each ``w_{i,t}`` by the factor
above, computed once over the whole batch; :func:`compile_weights` does that, so a sum-only native
built-in trains with the chosen aggregation, however the batch is later split.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, datum_input
from rlkit.types import Datum, TensorData

AGGREGATIONS = ("sum", "token_mean", "seq_mean", "constant")


def check_aggregation(mode: str, constant: Optional[float] = None) -> None:
    if mode not in AGGREGATIONS:
        raise InvalidInputError(f"aggregation={mode!r} must be one of {list(AGGREGATIONS)}")
    if mode == "constant" and (constant is None or constant <= 0):
        raise InvalidInputError(f"aggregation='constant' needs a positive constant, got {constant!r}")


def weight_scales(data: Sequence[Datum], mode: str, constant: Optional[float] = None) -> List[float]:
    """The factor each datum's weights are multiplied by."""
    check_aggregation(mode, constant)
    counts = [int((datum_input(d, "weights") != 0).sum()) for d in data]
    if mode == "sum":
        return [1.0] * len(data)
    if mode == "constant":
        assert constant is not None, "check_aggregation refuses mode='constant' without a constant"
        return [1.0 / float(constant)] * len(data)
    if mode == "token_mean":
        total = sum(counts)
        return [1.0 / total if total else 0.0] * len(data)
    return [1.0 / (len(data) * n) if n else 0.0 for n in counts]


def compile_weights(data: Sequence[Datum], mode: str, constant: Optional[float] = None) -> List[Datum]:
    """New datums whose ``weights`` carry the aggregation (other inputs shared, not copied)."""
    out = []
    for d, scale in zip(data, weight_scales(data, mode, constant)):
        if scale == 1.0:
            out.append(d)
            continue
        inputs = dict(d.loss_fn_inputs)
        inputs["weights"] = TensorData.from_torch(datum_input(d, "weights") * scale)
        out.append(Datum(model_input=d.model_input, loss_fn_inputs=inputs))
    return out


def aggregate_direct(
    per_token: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], mode: str, constant: Optional[float] = None
) -> Union[torch.Tensor, float]:
    """The formulas above on per-token terms ``l_it`` (already weighted) — the reference form. A
    0-d tensor; the number ``0`` (or ``0.0``) when nothing is summed (no terms, or ``seq_mean``
    with no weighted token), as Python's ``sum`` gives it."""
    check_aggregation(mode, constant)
    counts = [(w != 0).sum() for w in weights]
    if mode == "sum":
        return sum(t.sum() for t in per_token)
    if mode == "constant":
        assert constant is not None, "check_aggregation refuses mode='constant' without a constant"
        return sum(t.sum() for t in per_token) / constant
    if mode == "token_mean":
        return sum(t.sum() for t in per_token) / sum(counts)
    return sum(t.sum() / n for t, n in zip(per_token, counts) if n) / len(per_token)


def normaliser(loss: Loss, data: Sequence[Datum], mode: str, constant: Optional[float] = None) -> float:
    """What a loss that is *not* linear in its weights is divided by under ``mode``: 1 (sum), the
    batch's weighted-token count (token_mean), ``C`` (constant), or its number of units
    (seq_mean: :meth:`Loss.aggregation_units`, the datums or DPO's pairs)."""
    if mode == "sum":
        return 1.0
    if mode == "constant":
        assert constant is not None, "callers check_aggregation first: mode='constant' comes with a constant"
        return float(constant)
    if mode == "token_mean":
        return float(max(sum(int((datum_input(d, "weights") != 0).sum()) for d in data), 1))
    return float(max(loss.aggregation_units(data), 1))


def check_allowed(loss: Loss, mode: str) -> None:
    if mode not in loss.allowed_aggregations:
        raise InvalidInputError(
            f"{loss.name}: aggregation={mode!r} contradicts the loss (it allows {list(loss.allowed_aggregations)})"
        )


class Aggregated(Loss):
    """``loss`` under an aggregation mode, as one whole-batch loss.

    A loss that promises ``linear_in_weights`` is computed on compiled weights (exact for every
    mode). Any other loss is computed as it is and its value divided by :func:`normaliser` (the
    aggregation "around" it): for ``sum``, ``token_mean`` and ``constant`` this equals compiling
    the weights whenever the loss happens to be linear; for ``seq_mean`` it is the mean over the
    loss's own units. The factors depend on the whole batch, so the result is not separable.
    """

    def __init__(self, loss: Loss, mode: str = "sum", constant: Optional[float] = None):
        check_aggregation(mode, constant)
        check_allowed(loss, mode)
        self.inner = loss
        self.mode = mode
        self.constant = constant

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def required_inputs(self) -> Tuple[str, ...]:  # type: ignore[override]
        return self.inner.required_inputs

    @property
    def optional_inputs(self) -> Tuple[str, ...]:  # type: ignore[override]
        return self.inner.optional_inputs

    def validate(self, data, *, vocab_size=None) -> None:
        self.inner.validate(data, vocab_size=vocab_size)

    def compute(self, data, logprobs):
        if self.inner.linear_in_weights:
            return self.inner.compute(compile_weights(data, self.mode, self.constant), logprobs)
        value, metrics = self.inner.compute(data, logprobs)
        scale = normaliser(self.inner, data, self.mode, self.constant)
        if scale != 1.0:
            value = value / scale
            metrics = {**metrics, "loss:sum": float(value.detach())}
        return value, metrics
