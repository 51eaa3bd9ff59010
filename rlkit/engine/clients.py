"""The client bases every engine inherits: what a user calls on a training or sampling client,
every check and the routing of a loss, written once over the engine's primitives (DESIGN §2b;
``docs/adding-an-engine.md`` lists the primitives). :class:`EngineClientBase` is what both declare;
:class:`SamplingClientBase` and :class:`TrainingClientBase` are the front doors.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from rlkit.engine.capabilities import Capabilities
from rlkit.engine.checks import LOSS_OBJECT_CONFIG, check_sample_request, check_text, coerce_batch, prompt_tokens
from rlkit.errors import InvalidInputError
from rlkit.futures import APIFuture
from rlkit.types import (AdamParams, Datum, ForwardBackwardOutput, LoadStateResponse, ModelInput, OptimStepResponse,
    SampleResponse, SamplingParams, SaveStateResponse, SaveWeightsResponse)


class EngineClientBase:
    """What a training and a sampling client of an engine both declare: its :class:`Capabilities`,
    the model's vocabulary and context bounds where known, its tokenizer, and the stopped check."""

    _stopped: bool = False
    _stopped_message = "this client was stopped; create a new one"

    @property
    def capabilities(self) -> Capabilities:
        raise NotImplementedError

    @property
    def vocab_size(self) -> Optional[int]:
        return None

    @property
    def max_positions(self) -> Optional[int]:
        return None

    def get_tokenizer(self) -> Any:
        raise NotImplementedError

    def _check(self) -> None:
        if self._stopped:
            from rlkit.errors import ClientStoppedError

            raise ClientStoppedError(self._stopped_message)


class SamplingClientBase(EngineClientBase):
    """The front door every engine's sampling client inherits: ``sample`` / ``compute_logprobs``
    checked and coerced here once (:func:`prompt_tokens`, :func:`check_sample_request`), the
    stopped state, the context manager. A backend supplies the primitives
    ``_sample(tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs, **extensions)``
    and ``_compute_logprobs(tokens)`` and declares :attr:`capabilities`; ``vocab_size`` /
    ``max_positions`` bound the prompt where the engine knows them, ``max_samples`` caps
    ``num_samples`` where the service does, and ``extensions`` names the engine's own keywords
    (the local engine's ``on_token``, ``stop_token_ids``): any other keyword is refused in one line."""

    extensions: frozenset = frozenset()
    max_samples: Optional[int] = None
    _stopped: bool = False
    _stopped_message = "this sampling client was stopped; create a new one"

    def sample(
        self,
        prompt: ModelInput | Sequence[int] | str,
        num_samples: int = 1,
        sampling_params: Optional[SamplingParams | Dict[str, Any]] = None,
        *,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: Optional[int] = None,
        **extensions: Any,
    ) -> APIFuture[SampleResponse]:
        """``num_samples`` completions of ``prompt`` (a ``ModelInput``, token ids or text), prefilled once."""
        self._check()
        unknown = sorted(set(extensions) - set(self.extensions))
        if unknown:
            raise InvalidInputError(f"sample: unexpected keyword(s) {unknown} ({self.capabilities.engine}'s sample takes "
                                    f"{sorted(self.extensions) or 'none beyond the contract'})")
        tokens = prompt_tokens(prompt, self.get_tokenizer, "sample", vocab_size=self.vocab_size, max_positions=self.max_positions)
        params = check_sample_request(num_samples, sampling_params, topk_prompt_logprobs, max_samples=self.max_samples,
                                      capabilities=self.capabilities)
        return self._sample(tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs, **extensions)

    def compute_logprobs(self, prompt: ModelInput | Sequence[int] | str) -> APIFuture[List[Optional[float]]]:
        """One logprob per prompt token (the first is ``None``). The last token is only scored,
        never read, so a prompt may be one token longer than the context window (``max_positions + 1``)."""
        self._check()
        tokens = prompt_tokens(prompt, self.get_tokenizer, "compute_logprobs", vocab_size=self.vocab_size)
        if self.max_positions is not None and len(tokens) > self.max_positions + 1:
            raise InvalidInputError(f"compute_logprobs: prompt has {len(tokens)} tokens; the model's context window is "
                                    f"{self.max_positions} (a scored prompt may hold one more: its last token is never an input)")
        return self._compute_logprobs(tokens)

    def _sample(self, tokens: List[int], num_samples: int, params: SamplingParams, include_prompt_logprobs: bool,
                topk_prompt_logprobs: Optional[int], **extensions: Any) -> APIFuture[SampleResponse]:
        raise NotImplementedError

    def _compute_logprobs(self, tokens: List[int]) -> APIFuture[List[Optional[float]]]:
        raise NotImplementedError

    def stop(self) -> None:
        self._stopped = True

    def __enter__(self) -> "SamplingClientBase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class TrainingClientBase(EngineClientBase):
    """The front door every engine's training client inherits (as :class:`SamplingClientBase` is
    for sampling): every public method of :class:`TrainingClient`, every check, and the routing of
    a loss, written once.

    Checks, before anything reaches the engine: a stopped client refuses work
    (:class:`~rlkit.errors.ClientStoppedError`); the batch is coerced (:func:`coerce_batch`), its
    token ids bounded by :attr:`vocab_size` / :attr:`max_positions` where the engine knows them,
    and validated by the loss, built once per call (a built-in name's
    :func:`~rlkit.losses.builtin.builtin_loss`, which refuses unknown names and config keys; a
    :class:`~rlkit.losses.Loss` object takes no ``loss_fn_config``); ``AdamParams`` are coerced and
    held to ``capabilities.adam_limits``; checkpoint ids and descriptions must be strings; an
    engine keyword not in :attr:`extensions` is refused. The validated loss object is then routed
    by :class:`Capabilities`, in :func:`rlkit.engine.dispatch.dispatch` only, and handed to the
    engine as it is.

    A backend supplies :attr:`capabilities`, ``get_tokenizer()`` and the primitives, each
    returning an :class:`~rlkit.futures.APIFuture` unless said otherwise:

    - ``_forward_backward(data, loss, **extensions)`` / ``_forward(data, loss)``: ``loss`` is the
      validated :class:`~rlkit.losses.Loss` object; without ``capabilities.native_custom_losses`` it
      is always a built-in the capabilities declare, whose name and ``loss_fn_config`` the engine
      reads with :func:`~rlkit.losses.builtin.builtin_call` (with it, any Loss object: the engine
      differentiates it itself);
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
        """``(data, loss, named)``: the checked batch, the loss object (built here once, from a
        built-in's name and ``loss_fn_config``, or the caller's) that validated it, and whether
        the call named a built-in."""
        from rlkit.losses.base import Loss
        from rlkit.losses.builtin import builtin_loss

        self._check()
        unknown = sorted(set(extensions) - set(self.extensions))
        if unknown:
            raise InvalidInputError(f"{where}: unexpected keyword(s) {unknown} ({self.capabilities.engine}'s {where} takes "
                                    f"{sorted(self.extensions) or 'none beyond the contract'})")
        named = not isinstance(loss_fn, Loss)
        if not named and loss_fn_config:
            raise InvalidInputError(f"{where}: {LOSS_OBJECT_CONFIG}")
        loss = builtin_loss(loss_fn, loss_fn_config) if named else loss_fn
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
        return data, loss, named

    def forward_backward(self, batch: Sequence[Datum], loss_fn: Any = "cross_entropy", loss_fn_inputs: Optional[Dict[str, Any]] = None,
                         loss_fn_config: Optional[Dict[str, float]] = None, **extensions: Any) -> APIFuture[ForwardBackwardOutput]:
        """Forward + backward; gradients accumulate until ``optim_step``. ``loss_fn`` is a
        built-in's name (with ``loss_fn_config``) or any :class:`~rlkit.losses.Loss` object."""
        from rlkit.engine.dispatch import dispatch

        data, loss, named = self._batch(batch, loss_fn, loss_fn_inputs, loss_fn_config, "forward_backward", extensions)
        return dispatch(self, data, loss, named=named, backward=True, **extensions)

    def forward(self, batch: Sequence[Datum], loss_fn: Any = "cross_entropy", loss_fn_inputs: Optional[Dict[str, Any]] = None,
                loss_fn_config: Optional[Dict[str, float]] = None) -> APIFuture[ForwardBackwardOutput]:
        """The same outputs as ``forward_backward``, without gradient."""
        from rlkit.engine.dispatch import dispatch

        data, loss, named = self._batch(batch, loss_fn, loss_fn_inputs, loss_fn_config, "forward", {})
        return dispatch(self, data, loss, named=named, backward=False)

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
    def _forward_backward(self, data: List[Datum], loss: Any, **extensions: Any) -> APIFuture:
        raise NotImplementedError

    def _forward(self, data: List[Datum], loss: Any) -> APIFuture:
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
