"""The tinker backend's training and sampling clients: rlkit's session API over the SDK's.

Every call validates its arguments here (the same one-line errors as the local backend), then
hands the request to the SDK, which returns a future at once; the SDK future is bridged to an
:class:`~rlkit.futures.APIFuture` by a done-callback (no thread waits on it), and SDK errors
become rlkit errors (:func:`translate`). Training operations keep their submission order: the
SDK numbers them (``seq_id``) as they are submitted, and the service runs them in that order.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Protocol

from rlkit.backends.tinker import convert
from rlkit.backends.tinker.capabilities import tinker_capabilities
from rlkit.errors import CheckpointNotFoundError, ClientStoppedError, InvalidInputError, OperationError, RlkitError
from rlkit.futures import APIFuture
from rlkit.losses.base import Loss
from rlkit.losses.builtin import builtin_loss
from rlkit.session import Capabilities, SamplingClientBase, coerce_batch
from rlkit.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    LoadStateResponse,
    OptimStepResponse,
    SampleResponse,
    SaveStateResponse,
    SaveWeightsResponse,
)



class TinkerService(Protocol):
    """What the Tinker clients need from the service client that made them
    (:class:`~rlkit.backends.tinker.adapter.TinkerService` implements it; declared here so
    the clients never import the adapter)."""

    sdk: Any  # the tinker SDK's ServiceClient

    def get_tokenizer(self, base_model: str, sdk_trainer: Any = None) -> Any: ...

    def create_sampling_client(self, *args: Any, **kwargs: Any) -> Any: ...

    def _forget(self, client: Any) -> None: ...


def translate(exc: BaseException, where: str) -> BaseException:
    """An SDK error as an rlkit error with one line naming the operation."""
    if isinstance(exc, RlkitError):
        return exc
    text = " ".join(str(exc).split())[:1000]
    status = getattr(exc, "status_code", None)
    if status == 404 or "no checkpoint" in text:
        return CheckpointNotFoundError(f"{where}: {text}")
    if status in (400, 422) or type(exc).__name__ in ("BadRequestError", "UnprocessableEntityError"):
        return InvalidInputError(f"{where}: {text}")
    category = getattr(exc, "category", None)
    if category is not None and str(getattr(category, "value", category)) == "user":
        return InvalidInputError(f"{where}: {text}")
    return OperationError(f"{where}: {type(exc).__name__}: {text}")


def bridge(sdk_future: Any, parse: Callable[[Any], Any], where: str) -> APIFuture:
    """An rlkit future completed from an SDK future (``parse`` maps the result)."""
    out: APIFuture = APIFuture(operation=where)

    def done(f: Any) -> None:
        try:
            out.set_result(parse(f.result()))
        except BaseException as exc:  # noqa: BLE001 - forwarded to result()
            out.set_exception(translate(exc, where))

    sdk_future.future().add_done_callback(done)
    return out


def call(fn: Callable[[], Any], where: str) -> Any:
    """Run an SDK call that blocks (creation); raise its error as an rlkit error."""
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001
        raise translate(exc, where) from exc


class TinkerSamplingClient(SamplingClientBase):
    """Samples from one fixed set of weights on Tinker (checks: :class:`rlkit.session.SamplingClientBase`)."""

    def __init__(self, sdk_sampler: Any, tokenizer: Callable[[], Any]):
        self._sdk = sdk_sampler
        self._tokenizer = tokenizer
        self._stopped = False

    @property
    def capabilities(self) -> Capabilities:
        return tinker_capabilities()

    def get_tokenizer(self) -> Any:
        return self._tokenizer()

    def _sample(self, tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs) -> APIFuture[SampleResponse]:
        mi = convert.model_input(tokens)
        wire = convert.to_tinker_sampling(params)
        fut = call(
            lambda: self._sdk.sample(mi, num_samples, wire, include_prompt_logprobs, topk_prompt_logprobs or 0),
            "sample",
        )
        return bridge(fut, lambda res: convert.from_tinker_sample(res, mi.length), "sample")

    def _compute_logprobs(self, tokens) -> APIFuture[List[Optional[float]]]:
        mi = convert.model_input(tokens)
        return bridge(call(lambda: self._sdk.compute_logprobs(mi), "compute_logprobs"), list, "compute_logprobs")


class TinkerTrainingClient:
    """A LoRA training run on Tinker (see :mod:`rlkit.backends.tinker.adapter`)."""

    def __init__(self, service: "TinkerService", sdk_trainer: Any, base_model: str, rank: int):
        self._service = service
        self._sdk = sdk_trainer
        self.base_model = base_model
        self.rank = rank
        self.name = sdk_trainer.model_id
        self.steps = 0
        self._stopped = False
        self._lock = threading.RLock()

    def get_tokenizer(self) -> Any:
        return self._service.get_tokenizer(self.base_model, self._sdk)

    def _check(self) -> None:
        if self._stopped:
            raise ClientStoppedError(f"training client {self.name!r} was stopped; create a new one")

    @property
    def capabilities(self) -> Capabilities:
        return self._service.capabilities

    def supports_builtin_loss(self, name: str, config: Optional[Dict[str, float]] = None) -> bool:
        """Tinker's built-ins whose maths is rlkit's: ``cross_entropy``, ``importance_sampling``,
        ``ppo``, ``cispo`` (with their clip thresholds). Tinker's others (``gspo``, ``dro``, ...)
        are not rlkit's losses of those names, so rlkit's run linearised."""
        return self.capabilities.supports_builtin(name, config)

    def _data(self, batch: Any, loss_fn_inputs: Any, where: str) -> List[Datum]:
        return coerce_batch(batch, loss_fn_inputs, where)

    def _run(
        self, batch: Any, loss_fn: Any, loss_fn_inputs: Any, loss_fn_config: Any, backward: bool
    ) -> APIFuture[ForwardBackwardOutput]:
        where = "forward_backward" if backward else "forward"
        self._check()
        if isinstance(loss_fn, Loss):
            return self._loss_object(self._data(batch, loss_fn_inputs, where), loss_fn, loss_fn_config, backward)
        data = self._data(batch, loss_fn_inputs, where)
        name = getattr(loss_fn, "value", loss_fn)
        loss = builtin_loss(name, loss_fn_config)
        loss.validate(data)  # unknown name/config, keys, lengths, finiteness: refused here
        native = convert.native_data(name, data)
        if native is None:  # Tinker's built-in would not compute rlkit's loss on this batch
            return self._loss_object(data, loss, None, backward, force_linearised=True)
        wire = [convert.to_tinker_datum(d) for d in native]
        config = dict(loss_fn_config) if loss_fn_config else None
        method = self._sdk.forward_backward if backward else self._sdk.forward
        with self._lock:  # loss_fn is required by the SDK; loss_fn_config is its third positional
            fut = call(lambda: method(wire, name, config), where)
        return bridge(fut, lambda out: convert.from_tinker_output(out, data), where)

    def _loss_object(
        self, data: List[Datum], loss: Loss, loss_fn_config: Any, backward: bool, force_linearised: bool = False
    ):
        """A :class:`Loss` goes through rlkit's one dispatch path (native when it is a supported
        built-in, else linearised): :func:`rlkit.losses.run_loss` / ``score_loss``."""
        from rlkit.losses.execute import run_loss, score_loss

        if loss_fn_config:
            raise InvalidInputError("loss_fn_config applies to built-in names only; configure the Loss object")
        if backward:
            return run_loss(self, data, loss, force_linearised=force_linearised)
        return score_loss(self, data, loss)

    def forward_backward(
        self, batch, loss_fn: Any = "cross_entropy", loss_fn_inputs=None, loss_fn_config=None
    ) -> APIFuture[ForwardBackwardOutput]:
        """Forward + backward on Tinker; gradients accumulate until ``optim_step``."""
        return self._run(batch, loss_fn, loss_fn_inputs, loss_fn_config, backward=True)

    def forward(
        self, batch, loss_fn: Any = "cross_entropy", loss_fn_inputs=None, loss_fn_config=None
    ) -> APIFuture[ForwardBackwardOutput]:
        """The same outputs as ``forward_backward``, without gradient."""
        return self._run(batch, loss_fn, loss_fn_inputs, loss_fn_config, backward=False)

    def optim_step(self, adam_params: Optional[AdamParams | Dict[str, Any]] = None) -> APIFuture[OptimStepResponse]:
        """One AdamW step with rlkit's ``AdamParams`` (its defaults, sent explicitly)."""
        self._check()
        params = convert.to_tinker_adam(AdamParams.coerce(adam_params, "optim_step: adam_params"))

        def parse(out: Any) -> OptimStepResponse:
            self.steps += 1
            return OptimStepResponse(metrics=convert.metrics_of(out))

        with self._lock:
            fut = call(lambda: self._sdk.optim_step(params), "optim_step")
        return bridge(fut, parse, "optim_step")

    # -- checkpoints: tinker:// paths ---------------------------------------------------------------
    def save_state(
        self,
        description: str = "",
        *,
        name: Optional[str] = None,
        overwrite: bool = False,
        ttl_seconds: Optional[int] = None,
    ) -> APIFuture[SaveStateResponse]:
        """Save adapter + optimizer; the id is a ``tinker://RUN/weights/NAME`` path (Tinker's first
        positional is a name: ``name=`` or the description, made path-safe and unique)."""
        self._check()
        ckpt = convert.checkpoint_name(description, name, "state")
        with self._lock:
            fut = call(lambda: self._sdk.save_state(ckpt, ttl_seconds, overwrite), "save_state")
        return bridge(fut, lambda out: SaveStateResponse(model_package_arn=out.path), "save_state")

    def save_weights_for_sampler(
        self,
        description: str = "",
        merge_weights: bool = False,
        *,
        name: Optional[str] = None,
        ttl_seconds: Optional[int] = None,
    ) -> APIFuture[SaveWeightsResponse]:
        """Save the adapter only; the id is a ``tinker://RUN/sampler_weights/NAME`` path."""
        self._check()
        ckpt = convert.checkpoint_name(description, name, "weights")
        with self._lock:
            fut = call(lambda: self._sdk.save_weights_for_sampler(ckpt, ttl_seconds), "save_weights_for_sampler")
        return bridge(fut, lambda out: SaveWeightsResponse(model_package_arn=out.path), "save_weights_for_sampler")

    def _reload(self, path: str, with_optimizer: bool) -> APIFuture[LoadStateResponse]:
        """Tinker loads a checkpoint as a *new* training client; this client moves to it (the
        operations already submitted finish on the old one, in order)."""
        self._check()
        where = "load_state_with_optimizer" if with_optimizer else "load_state"
        sdk = self._service.sdk
        create = (
            sdk.create_training_client_from_state_with_optimizer
            if with_optimizer
            else sdk.create_training_client_from_state
        )
        new = call(lambda: create(path).result(), where)
        with self._lock:
            self._sdk = new
            self.name = new.model_id
        return APIFuture.completed(LoadStateResponse(model_package_arn=path), operation=where)

    def load_state(self, model_package_arn: str) -> APIFuture[LoadStateResponse]:
        """Load a checkpoint's weights; the optimizer starts fresh."""
        return self._reload(model_package_arn, with_optimizer=False)

    def load_state_with_optimizer(self, model_package_arn: str) -> APIFuture[LoadStateResponse]:
        """Load a ``save_state`` checkpoint's weights and optimizer state."""
        return self._reload(model_package_arn, with_optimizer=True)

    def save_weights_and_get_sampling_client(
        self, description: str = "", merge_weights: bool = False, *, name: Optional[str] = None
    ) -> TinkerSamplingClient:
        """A sampler on the current weights (Tinker's ephemeral sampler weights; with ``name=``
        also a durable ``sampler_weights`` checkpoint)."""
        self._check()
        if name is not None:
            return self.create_sampling_client(
                self.save_weights_for_sampler(description, name=name).result().model_package_arn
            )
        with self._lock:
            fut = call(lambda: self._sdk.save_weights_and_get_sampling_client(), "save_weights_and_get_sampling_client")
        sdk_sampler = call(lambda: fut.result(), "save_weights_and_get_sampling_client")
        return TinkerSamplingClient(sdk_sampler, self.get_tokenizer)

    def create_sampling_client(self, model_package_arn: str = "") -> TinkerSamplingClient:
        """A sampler on a ``tinker://`` checkpoint (``""`` = the base model)."""
        self._check()
        if not model_package_arn:
            return self._service.create_sampling_client(base_model=self.base_model)
        sdk_sampler = call(
            lambda: self._sdk.create_sampling_client(model_package_arn).result(), "create_sampling_client"
        )
        return TinkerSamplingClient(sdk_sampler, self.get_tokenizer)

    @property
    def step(self) -> int:
        return self.steps

    def stop(self) -> None:
        """Refuse new work. Idempotent. (A Tinker training run ends with its service session,
        which :meth:`TinkerService.close` finishes.)"""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._service._forget(self)

    def __enter__(self) -> "TinkerTrainingClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
