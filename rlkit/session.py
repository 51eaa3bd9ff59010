"""The training-session contract: ``ServiceClient``, ``TrainingClient``, ``SamplingClient``.

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
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, runtime_checkable

from rlkit.errors import InvalidInputError
from rlkit.front_door import (  # noqa: F401 - re-exported: the contract's names
    DEFAULT_LORA_ALPHA,
    DEFAULT_LORA_RANK,
    FROM_STATE_KEYWORDS,
    LOSS_OBJECT_CONFIG,
    SESSION_OPTIONS,
    Capabilities,
    EngineClientBase,
    LoraRequest,
    SamplingClientBase,
    check_sample_request,
    check_session_options,
    check_text,
    coerce_batch,
    prompt_tokens,
)
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


class TrainingClientBase(EngineClientBase):
    """The front door every engine's training client inherits (as :class:`SamplingClientBase` is
    for sampling): every public method of :class:`TrainingClient`, every check, and the routing of
    a loss, written once.

    Checks, before anything reaches the engine: a stopped client refuses work
    (:class:`~rlkit.errors.ClientStoppedError`); the batch is coerced (:func:`coerce_batch`), its
    token ids bounded by :attr:`vocab_size` / :attr:`max_positions` where the engine knows them,
    and validated by the loss (a built-in name's :func:`~rlkit.losses.builtin.builtin_loss`, which
    refuses unknown names and config keys; a :class:`~rlkit.losses.Loss` object takes no
    ``loss_fn_config``); ``AdamParams`` are coerced and held to ``capabilities.adam_limits``;
    checkpoint ids and descriptions must be strings; an engine keyword not in :attr:`extensions`
    is refused. The loss is then routed by :class:`Capabilities`, in
    :func:`rlkit.losses.execute.dispatch` only.

    A backend supplies :attr:`capabilities`, ``get_tokenizer()`` and the primitives, each
    returning an :class:`~rlkit.futures.APIFuture` unless said otherwise:

    - ``_forward_backward(data, name, config, **extensions)`` / ``_forward(data, name, config)``:
      a built-in its capabilities declare (``name`` may also be a ``Loss`` object when
      ``capabilities.native_custom_losses``: the engine differentiates it itself);
    - ``_optim_step(params)``; ``_save(kind, description, *, name, merge_weights, overwrite,
      ttl_seconds)`` with ``kind`` ``"state"`` or ``"weights"``; ``_load(checkpoint, with_optimizer)``;
    - ``_sampler(checkpoint)`` and ``_publish(description, merge_weights)``: sampling clients (not
      futures) on a saved checkpoint (``""``: the base model) and on the current weights;
    - optionally ``_native_batch_ok(name, data)`` (``False``: this batch runs linearised) and
      ``_stop()`` (teardown after :meth:`stop` marked the client stopped).

    It calls ``TrainingClientBase.__init__(name, base_model)``; :attr:`_lock` is the lock its
    submissions hold, so that no work is queued after :meth:`stop`.
    """

    #: the engine's own keywords of ``forward_backward`` (SageMaker's ``return_logprobs``)
    extensions: frozenset = frozenset()
    #: optimizer steps taken (a backend counts them, or overrides :attr:`step`)
    steps: int = 0

    def __init__(self, name: str, base_model: str):
        import threading

        self.name = name
        self.base_model = base_model  # part of the contract: a loop opens a reference sampler on it
        self._stopped = False
        self._stopped_message = f"training client {name!r} was stopped; create a new one"
        self._lock = threading.RLock()

    def supports_builtin_loss(self, name: str, config: Optional[Dict[str, float]] = None) -> bool:
        """Whether the built-in ``name`` with ``config`` runs natively here (``capabilities``)."""
        return self.capabilities.supports_builtin(name, config)

    # -- training ---------------------------------------------------------------------------------
    def _batch(self, batch: Any, loss_fn: Any, loss_fn_inputs: Any, loss_fn_config: Any, where: str, extensions: Mapping[str, Any]):
        """``(data, loss, name)``: the checked batch, the loss object that validated it, and the
        built-in's name (``None`` for a Loss object)."""
        from rlkit.losses.base import Loss
        from rlkit.losses.builtin import builtin_loss

        self._check()
        unknown = sorted(set(extensions) - set(self.extensions))
        if unknown:
            raise InvalidInputError(f"{where}: unexpected keyword(s) {unknown} ({self.capabilities.engine}'s {where} takes "
                                    f"{sorted(self.extensions) or 'none beyond the contract'})")
        if isinstance(loss_fn, Loss):
            if loss_fn_config:
                raise InvalidInputError(f"{where}: {LOSS_OBJECT_CONFIG}")
            loss, name = loss_fn, None
        else:
            name = getattr(loss_fn, "value", loss_fn)
            loss = builtin_loss(name, loss_fn_config)
        data = coerce_batch(batch, loss_fn_inputs, where)
        vocab, window = self.vocab_size, self.max_positions
        for i, datum in enumerate(data):
            tokens = datum.model_input.to_ints()
            bad = [t for t in tokens if t < 0 or (vocab is not None and t >= vocab)]
            if bad:
                bound = f"[0, {vocab})" if vocab is not None else "(token ids are >= 0)"
                raise InvalidInputError(f"{where}: datum[{i}].model_input holds token {bad[0]}, outside the vocabulary {bound}")
            if window is not None and len(tokens) > window:
                raise InvalidInputError(f"{where}: datum[{i}] has {len(tokens)} tokens; the model's context window is {window}")
        loss.validate(data, vocab_size=vocab)
        return data, loss, name

    def forward_backward(self, batch: Sequence[Datum], loss_fn: Any = "cross_entropy", loss_fn_inputs: Optional[Dict[str, Any]] = None,
                         loss_fn_config: Optional[Dict[str, float]] = None, **extensions: Any) -> APIFuture[ForwardBackwardOutput]:
        """Forward + backward; gradients accumulate until ``optim_step``. ``loss_fn`` is a
        built-in's name (with ``loss_fn_config``) or any :class:`~rlkit.losses.Loss` object."""
        from rlkit.losses.execute import dispatch

        data, loss, name = self._batch(batch, loss_fn, loss_fn_inputs, loss_fn_config, "forward_backward", extensions)
        return dispatch(self, data, loss, name, loss_fn_config, backward=True, **extensions)

    def forward(self, batch: Sequence[Datum], loss_fn: Any = "cross_entropy", loss_fn_inputs: Optional[Dict[str, Any]] = None,
                loss_fn_config: Optional[Dict[str, float]] = None) -> APIFuture[ForwardBackwardOutput]:
        """The same outputs as ``forward_backward``, without gradient."""
        from rlkit.losses.execute import dispatch

        data, loss, name = self._batch(batch, loss_fn, loss_fn_inputs, loss_fn_config, "forward", {})
        return dispatch(self, data, loss, name, loss_fn_config, backward=False)

    def _native_batch_ok(self, name: str, data: List[Datum]) -> bool:
        """Whether the engine's built-in ``name`` computes rlkit's loss on this batch (else linearised)."""
        return True

    def optim_step(self, adam_params: Optional[AdamParams | Dict[str, Any]] = None) -> APIFuture[OptimStepResponse]:
        """One AdamW step with rlkit's :class:`~rlkit.types.AdamParams` (defaults when ``None``)."""
        self._check()
        params = AdamParams.coerce(adam_params, "optim_step: adam_params")
        self.capabilities.check_adam(params)
        return self._optim_step(params)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_state(self, description: str = "", *, name: Optional[str] = None, overwrite: bool = False,
                   ttl_seconds: Optional[int] = None) -> APIFuture[SaveStateResponse]:
        """Save adapter + optimizer; the future resolves to the checkpoint id (``name``,
        ``overwrite``, ``ttl_seconds``: honoured where the engine has them)."""
        self._check()
        check_text(description, "description", "save_state")
        check_text(name, "name", "save_state", optional=True)
        return self._save("state", description, name=name, merge_weights=False, overwrite=overwrite, ttl_seconds=ttl_seconds)

    def save_weights_for_sampler(self, description: str = "", merge_weights: bool = False, *, name: Optional[str] = None,
                                 ttl_seconds: Optional[int] = None) -> APIFuture[SaveWeightsResponse]:
        """Save the adapter only (what a sampler needs)."""
        self._check()
        check_text(description, "description", "save_weights_for_sampler")
        check_text(name, "name", "save_weights_for_sampler", optional=True)
        return self._save("weights", description, name=name, merge_weights=merge_weights, overwrite=False, ttl_seconds=ttl_seconds)

    def _checkpoint_id(self, model_package_arn: Any, where: str) -> str:
        """A checkpoint id: a string (else one line); ``""`` names no checkpoint (not found)."""
        self._check()
        check_text(model_package_arn, "model_package_arn", where)
        if not model_package_arn:
            from rlkit.errors import CheckpointNotFoundError

            raise CheckpointNotFoundError(f"{where}: no checkpoint '' (pass the id save_state returned)")
        return model_package_arn

    def load_state(self, model_package_arn: str) -> APIFuture[LoadStateResponse]:
        """Load a checkpoint's weights; the optimizer starts fresh."""
        return self._load(self._checkpoint_id(model_package_arn, "load_state"), False)

    def load_state_with_optimizer(self, model_package_arn: str) -> APIFuture[LoadStateResponse]:
        """Load a ``save_state`` checkpoint's weights and optimizer state (resume exactly)."""
        return self._load(self._checkpoint_id(model_package_arn, "load_state_with_optimizer"), True)

    def save_weights_and_get_sampling_client(self, description: str = "", merge_weights: bool = False, *,
                                             name: Optional[str] = None) -> Any:
        """A sampler on the current weights. With ``name=`` the weights are also a durable
        checkpoint (``save_weights_for_sampler``) and the sampler reads that checkpoint."""
        self._check()
        check_text(description, "description", "save_weights_and_get_sampling_client")
        if name is not None:
            checkpoint = self.save_weights_for_sampler(description, merge_weights, name=name).result().model_package_arn
            return self._sampler(checkpoint)
        return self._publish(description, merge_weights)

    def create_sampling_client(self, model_package_arn: str = "") -> Any:
        """A sampler on a saved checkpoint (``""``: the base model)."""
        self._check()
        check_text(model_package_arn, "model_package_arn", "create_sampling_client")
        return self._sampler(model_package_arn)

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Optimizer steps taken by this session."""
        return self.steps

    def stop(self) -> None:
        """Refuse new work, then let the engine finish what is queued and tear down. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop()

    def _stop(self) -> None:
        pass

    def __enter__(self) -> "TrainingClientBase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the primitives ---------------------------------------------------------------------------
    def _forward_backward(self, data: List[Datum], name: Any, config: Optional[Dict[str, float]], **extensions: Any) -> APIFuture:
        raise NotImplementedError

    def _forward(self, data: List[Datum], name: Any, config: Optional[Dict[str, float]]) -> APIFuture:
        raise NotImplementedError

    def _optim_step(self, params: AdamParams) -> APIFuture:
        raise NotImplementedError

    def _save(self, kind: str, description: str, *, name: Optional[str], merge_weights: bool, overwrite: bool,
              ttl_seconds: Optional[int]) -> APIFuture:
        raise NotImplementedError

    def _load(self, checkpoint: str, with_optimizer: bool) -> APIFuture:
        raise NotImplementedError

    def _sampler(self, checkpoint: str) -> Any:
        raise NotImplementedError

    def _publish(self, description: str, merge_weights: bool) -> Any:
        raise NotImplementedError


class ServiceClientBase:
    """The front door every engine's service client inherits: LoRA creation (the SDK's signature
    and defaults, rlkit's alpha, see :data:`DEFAULT_LORA_ALPHA`; the session options every backend
    accepts; the engine's :class:`Capabilities` LoRA checks), creation from a checkpoint (the same
    keywords everywhere, :data:`FROM_STATE_KEYWORDS`), the registry of the sessions it runs,
    ``list_sessions`` / ``stop_session`` / ``close`` — once.

    A backend calls ``ServiceClientBase.__init__(self)`` and implements ``_create_lora(request: LoraRequest)``, and either
    ``_checkpoint_shape(checkpoint)`` (``{"base_model", "rank", "alpha", "train_attn",
    "train_mlp"}``, ``None`` where unknown: the default from-state path then creates a LoRA client
    of that shape and loads the checkpoint into it) or its own ``_from_state``. It registers each
    client it hands out with :meth:`_track` (clients :meth:`_forget` themselves when stopped) and
    may add teardown in ``_close(errors)`` and ``_stop_untracked(name)`` (a session it does not hold).
    """

    def __init__(self) -> None:
        import threading

        self._clients: Dict[int, Any] = {}
        self._registry_lock = threading.RLock()
        self._closed = False

    @property
    def capabilities(self) -> Capabilities:
        raise NotImplementedError

    def _check_open(self) -> None:
        """Refuse new sessions once closed (a backend may add its own preconditions)."""
        if self._closed:
            from rlkit.errors import ClientStoppedError

            raise ClientStoppedError("this service client was closed")

    def create_lora_training_client(
        self,
        base_model: str,
        *,
        rank: int = DEFAULT_LORA_RANK,
        alpha: int = DEFAULT_LORA_ALPHA,
        training_session_name: Optional[str] = None,
        seed: Optional[int] = None,
        train_mlp: Optional[bool] = None,
        train_attn: Optional[bool] = None,
        train_unembed: Optional[bool] = None,
        **session_options: Any,
    ) -> Any:
        """A new LoRA training client on ``base_model``. SageMaker's session options
        (``model_package_group_arn``, ``s3_output_path``, ``kms_key_arn``, ``vpc_config``,
        ``user_metadata``) are accepted everywhere (other engines ignore them) so one call runs on
        every backend; anything else, or a LoRA shape the engine cannot honour, is refused in one line."""
        self._check_open()
        check_session_options(session_options)
        self.capabilities.check_lora(rank, alpha, train_attn=train_attn, train_mlp=train_mlp, train_unembed=train_unembed)
        return self._create_lora(LoraRequest(base_model, rank, alpha, seed, train_attn, train_mlp, train_unembed,
                                             training_session_name, dict(session_options)))

    def _create_lora(self, request: LoraRequest) -> Any:
        raise NotImplementedError

    def create_full_training_client(self, base_model: str, *, training_session_name: Optional[str] = None,
                                    seed: Optional[int] = None, **session_options: Any) -> Any:
        """A new full-parameter training client on ``base_model``: every weight trains, no adapter
        (a :class:`LoraRequest` of rank 0, as its checkpoints record). Refused in one line where
        the engine's :attr:`Capabilities.full_finetune` is false."""
        self._check_open()
        check_session_options(session_options, "create_full_training_client")
        if not self.capabilities.full_finetune:
            raise InvalidInputError(f"create_full_training_client: the {self.capabilities.engine} engine trains LoRA adapters "
                                    "only; use create_lora_training_client (model.lora=true), or backend=local for full fine-tuning")
        return self._create_lora(LoraRequest(base_model, 0, 0, seed, None, None, None, training_session_name, dict(session_options)))

    # -- from a checkpoint --------------------------------------------------------------------------
    def create_training_client_from_state(self, model_package_arn: str, **kwargs: Any) -> Any:
        """A new session holding a checkpoint's weights (the optimizer starts fresh)."""
        return self._from_state(self._from_state_request(model_package_arn, kwargs, "create_training_client_from_state"), False, kwargs)

    def create_training_client_from_state_with_optimizer(self, model_package_arn: str, **kwargs: Any) -> Any:
        """A new session resuming a ``save_state`` checkpoint (weights and optimizer)."""
        where = "create_training_client_from_state_with_optimizer"
        return self._from_state(self._from_state_request(model_package_arn, kwargs, where), True, kwargs)

    def _from_state_request(self, checkpoint: Any, kwargs: Mapping[str, Any], where: str) -> str:
        self._check_open()
        check_text(checkpoint, "model_package_arn", where)
        if not checkpoint:
            from rlkit.errors import CheckpointNotFoundError

            raise CheckpointNotFoundError(f"{where}: no checkpoint '' (pass the id save_state returned)")
        unknown = sorted(set(kwargs) - FROM_STATE_KEYWORDS)
        if unknown:
            raise InvalidInputError(f"{where}: unknown keyword(s) {unknown} (it takes {sorted(FROM_STATE_KEYWORDS)})")
        return checkpoint

    def _from_state(self, checkpoint: str, with_optimizer: bool, kwargs: Dict[str, Any]) -> Any:
        """The checkpoint's shape (keywords override it), a new LoRA client of that shape, the
        checkpoint loaded into it; the client is stopped if the load fails."""
        shape = self._checkpoint_shape(checkpoint)
        kwargs = dict(kwargs)
        base_model = kwargs.pop("base_model", None) or shape["base_model"]
        for key in ("rank", "alpha", "train_attn", "train_mlp"):
            if kwargs.get(key) is None and shape.get(key) is not None:
                kwargs[key] = shape[key]
        if kwargs.get("rank") is None or kwargs.get("alpha") is None:
            raise InvalidInputError(
                f"checkpoint {checkpoint!r} does not record its LoRA shape (it was not saved by rlkit); pass rank=... and alpha=..."
            )
        if kwargs["rank"] == 0:  # a full fine-tuning checkpoint (every weight, no adapter)
            lora_keys = ("rank", "alpha", "train_attn", "train_mlp", "train_unembed")
            client = self.create_full_training_client(base_model, **{k: v for k, v in kwargs.items() if k not in lora_keys})
        else:
            client = self.create_lora_training_client(base_model, **kwargs)
        try:
            (client.load_state_with_optimizer if with_optimizer else client.load_state)(checkpoint).result()
        except BaseException:
            client.stop()
            raise
        return client

    def _checkpoint_shape(self, checkpoint: str) -> Dict[str, Any]:
        raise NotImplementedError

    # -- the sessions this client runs ---------------------------------------------------------------
    def _track(self, client: Any) -> None:
        """Hold ``client`` (it has ``name``, ``base_model``, ``stop()``) until it forgets itself;
        a client made after :meth:`close` is stopped and refused."""
        with self._registry_lock:
            closed = self._closed
            if not closed:
                self._clients[id(client)] = client
        if closed:
            from rlkit.errors import ClientStoppedError

            client.stop()
            raise ClientStoppedError("this service client was closed")

    def _forget(self, client: Any) -> None:
        with self._registry_lock:
            self._clients.pop(id(client), None)

    def _running(self) -> List[Any]:
        with self._registry_lock:
            return list(self._clients.values())

    def list_sessions(self) -> List[Dict[str, Any]]:
        """The sessions this client runs."""
        return [{"training_session_name": c.name, "status": "Running", "base_model": c.base_model} for c in self._running()]

    def stop_session(self, training_session: str) -> None:
        """Stop a session by name (or ARN: its last part)."""
        name = str(training_session).rsplit("/", 1)[-1]
        client = next((c for c in self._running() if c.name == name), None)
        if client is None:
            self._stop_untracked(name)
        else:
            client.stop()

    def _stop_untracked(self, name: str) -> None:
        raise InvalidInputError(f"no running {self.capabilities.engine} session named {name!r} in this client")

    def close(self) -> None:
        """Stop every session this client started, then the engine's own teardown. Idempotent; a
        failing stop does not keep the others running (the first failure is raised afterwards,
        unless another exception is already on its way out)."""
        import sys

        with self._registry_lock:
            first, self._closed = not self._closed, True
        errors: List[BaseException] = []
        if first:
            for client in self._running():
                try:
                    client.stop()
                except Exception as exc:  # noqa: BLE001 - stop the others, then report
                    errors.append(exc)
        errors += self._close(first)
        if errors and sys.exc_info()[1] is None:
            raise errors[0]

    def _close(self, first: bool) -> List[BaseException]:
        """The engine's teardown after the sessions stopped (``first``: the first ``close()``);
        returns the failures to report."""
        return []
