"""The training-session contract as protocols: ``ServiceClient``, ``TrainingClient``, ``SamplingClient``.

These protocols pin the names, argument order and defaults of
``sagemaker.train.training_session`` (sagemaker-train 1.27.0), so a loop written against them runs
on every backend (``rlkit.connect("local")``, ``rlkit.connect("sagemaker", ...)``).

Semantics every backend honours:

- every operation returns an :class:`~rlkit.futures.APIFuture` at once;
- training operations execute strictly in submission order; ``forward_backward`` gradients
  accumulate until ``optim_step``; ``forward`` computes the same outputs without gradient;
- per-token ``loss_fn_inputs`` carry one value per token of the datum, prompt included
  (``target_tokens[i] = tokens[i+1]``; prompt positions have ``weights = 0``);
- checkpoint ids are opaque strings; ``save_state`` = adapter + optimizer,
  ``save_weights_for_sampler`` = adapter only; ``load_state`` resets the optimizer,
  ``load_state_with_optimizer`` restores it;
- clients are context managers, ``stop()`` is idempotent, a stopped client refuses new work;
- every engine declares its :class:`Capabilities`; what it cannot honour is refused up front.

The bases in :mod:`rlkit.engine.clients` and :mod:`rlkit.engine.service` implement them once over
an engine's primitives.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Sequence, runtime_checkable

from rlkit.engine.capabilities import DEFAULT_LORA_ALPHA, DEFAULT_LORA_RANK, Capabilities
from rlkit.futures import APIFuture
from rlkit.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    LoadStateResponse,
    ModelInput,
    OptimStepResponse,
    SampleResponse,
    SamplingParams,
    SaveStateResponse,
    SaveWeightsResponse,
)


@runtime_checkable
class SamplingClient(Protocol):
    """Samples from, and scores with, one fixed set of weights."""

    def get_tokenizer(self) -> Any: ...

    def sample(
        self,
        prompt: ModelInput | Sequence[int] | str,
        num_samples: int = 1,
        sampling_params: Optional[SamplingParams] = None,
        *,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: Optional[int] = None,
    ) -> APIFuture[SampleResponse]: ...

    def compute_logprobs(self, prompt: ModelInput | Sequence[int] | str) -> APIFuture[List[Optional[float]]]: ...

    def stop(self) -> None: ...


@runtime_checkable
class TrainingClient(Protocol):
    """A model with a LoRA adapter and an optimizer, trained by the caller's loop
    (:class:`TrainingClientBase` implements it over an engine's primitives)."""

    name: str  # the training session's name
    base_model: str  # what it was created on (a loop opens a reference sampler on it)

    def get_tokenizer(self) -> Any: ...

    def forward_backward(
        self,
        batch: Sequence[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_inputs: Optional[Dict[str, Any]] = None,
        loss_fn_config: Optional[Dict[str, float]] = None,
    ) -> APIFuture[ForwardBackwardOutput]: ...

    def forward(
        self,
        batch: Sequence[Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_inputs: Optional[Dict[str, Any]] = None,
        loss_fn_config: Optional[Dict[str, float]] = None,
    ) -> APIFuture[ForwardBackwardOutput]: ...

    def optim_step(self, adam_params: Optional[AdamParams] = None) -> APIFuture[OptimStepResponse]: ...

    def save_state(self, description: str = "", *, name: Optional[str] = None) -> APIFuture[SaveStateResponse]: ...

    def save_weights_for_sampler(self, description: str = "", *, name: Optional[str] = None) -> APIFuture[SaveWeightsResponse]: ...

    def load_state(self, model_package_arn: str) -> APIFuture[LoadStateResponse]: ...

    def load_state_with_optimizer(self, model_package_arn: str) -> APIFuture[LoadStateResponse]: ...

    def save_weights_and_get_sampling_client(self, description: str = "", *, name: Optional[str] = None) -> SamplingClient: ...

    def create_sampling_client(self, model_package_arn: str = "") -> SamplingClient: ...

    def supports_builtin_loss(self, name: str, config: Optional[Dict[str, float]] = None) -> bool: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def stop(self) -> None: ...


@runtime_checkable
class ServiceClient(Protocol):
    """Entry point of a backend: creates training and sampling clients."""

    def create_lora_training_client(
        self, base_model: str, *, rank: int = DEFAULT_LORA_RANK, alpha: int = DEFAULT_LORA_ALPHA, **kwargs: Any
    ) -> TrainingClient: ...

    def create_training_client_from_state(self, model_package_arn: str, **kwargs: Any) -> TrainingClient: ...

    def create_training_client_from_state_with_optimizer(self, model_package_arn: str, **kwargs: Any) -> TrainingClient: ...

    def create_sampling_client(self, *, base_model: Optional[str] = None, model_package_arn: Optional[str] = None) -> SamplingClient: ...

    def list_sessions(self) -> List[Any]: ...

    def stop_session(self, training_session: str) -> None: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def close(self) -> None: ...
