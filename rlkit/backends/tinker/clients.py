"""The tinker backend's training and sampling clients: rlkit's session API over the SDK's.

Every call validates its arguments here (the same one-line errors as the local backend), then
hands the request to the SDK, which returns a future at once; the SDK future is bridged to an
:class:`~rlkit.futures.APIFuture` by a done-callback (no thread waits on it), and SDK errors
become rlkit errors (:func:`translate`). Training operations keep their submission order: the
SDK numbers them (``seq_id``) as they are submitted, and the service runs them in that order.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Protocol

from rlkit.backends.tinker import convert
from rlkit.backends.tinker.capabilities import tinker_capabilities
from rlkit.engine.capabilities import Capabilities
from rlkit.engine.clients import SamplingClientBase, TrainingClientBase
from rlkit.errors import CheckpointNotFoundError, InvalidInputError, OperationError, RlkitError
from rlkit.futures import APIFuture
from rlkit.losses.base import Loss
from rlkit.losses.builtin import builtin_call
from rlkit.types import (AdamParams, Datum, ForwardBackwardOutput, LoadStateResponse, OptimStepResponse,
    SampleResponse, SaveStateResponse, SaveWeightsResponse)



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
    """Samples from one fixed set of weights on Tinker (checks: :class:`rlkit.engine.clients.SamplingClientBase`)."""

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


class TinkerTrainingClient(TrainingClientBase):
    """A LoRA training run on Tinker (see :mod:`rlkit.backends.tinker.adapter`): the primitives of
    :class:`rlkit.engine.clients.TrainingClientBase`, which owns every check and the routing of a loss.
    Tinker's built-ins whose maths is rlkit's (``cross_entropy``, ``importance_sampling``, ``ppo``,
    ``cispo``, with their clip thresholds) run natively; Tinker's others (``gspo``, ``dro``, ...)
    are not rlkit's losses of those names, so rlkit's run linearised."""

    def __init__(self, service: "TinkerService", sdk_trainer: Any, base_model: str, rank: int):
        super().__init__(sdk_trainer.model_id, base_model)
        self._service = service
        self._sdk = sdk_trainer
        self.rank = rank

    def get_tokenizer(self) -> Any:
        return self._service.get_tokenizer(self.base_model, self._sdk)

    @property
    def capabilities(self) -> Capabilities:
        return self._service.capabilities

    def _native_batch_ok(self, name: str, data: List[Datum]) -> bool:
        """Tinker's built-in computes rlkit's loss on this batch (:func:`.convert.native_data`)."""
        return convert.native_data(name, data) is not None

    def _pass(self, data: List[Datum], loss: Loss, backward: bool) -> APIFuture[ForwardBackwardOutput]:
        """The built-in ``loss`` is, by its name and ``loss_fn_config`` (as the call gave them)."""
        where = "forward_backward" if backward else "forward"
        name, config = builtin_call(loss)
        wire = [convert.to_tinker_datum(d) for d in convert.native_data(name, data)]
        config = dict(config) if config else None
        with self._lock:  # loss_fn is required by the SDK; loss_fn_config is its third positional
            self._check()
            method = self._sdk.forward_backward if backward else self._sdk.forward
            fut = call(lambda: method(wire, name, config), where)
        return bridge(fut, lambda out: convert.from_tinker_output(out, data), where)

    def _forward_backward(self, data: List[Datum], loss: Loss) -> APIFuture[ForwardBackwardOutput]:
        return self._pass(data, loss, backward=True)

    def _forward(self, data: List[Datum], loss: Loss) -> APIFuture[ForwardBackwardOutput]:
        return self._pass(data, loss, backward=False)

    def _optim_step(self, params: AdamParams) -> APIFuture[OptimStepResponse]:
        """One AdamW step with rlkit's ``AdamParams`` (its defaults, sent explicitly)."""
        wire = convert.to_tinker_adam(params)

        def parse(out: Any) -> OptimStepResponse:
            self.steps += 1
            return OptimStepResponse(metrics=convert.metrics_of(out))

        with self._lock:
            self._check()
            fut = call(lambda: self._sdk.optim_step(wire), "optim_step")
        return bridge(fut, parse, "optim_step")

    # -- checkpoints: tinker:// paths ---------------------------------------------------------------
    def _save(self, kind: str, description: str, *, name: Optional[str], merge_weights: bool, overwrite: bool,
              ttl_seconds: Optional[int]) -> APIFuture:
        """``tinker://RUN/weights/NAME`` (state) or ``tinker://RUN/sampler_weights/NAME`` (weights):
        Tinker's first positional is a name (``name=`` or the description, made path-safe and unique)."""
        ckpt = convert.checkpoint_name(description, name, kind)
        with self._lock:
            self._check()
            if kind == "state":
                fut = call(lambda: self._sdk.save_state(ckpt, ttl_seconds, overwrite), "save_state")
                return bridge(fut, lambda out: SaveStateResponse(model_package_arn=out.path), "save_state")
            fut = call(lambda: self._sdk.save_weights_for_sampler(ckpt, ttl_seconds), "save_weights_for_sampler")
        return bridge(fut, lambda out: SaveWeightsResponse(model_package_arn=out.path), "save_weights_for_sampler")

    def _load(self, path: str, with_optimizer: bool) -> APIFuture[LoadStateResponse]:
        """Tinker loads a checkpoint as a *new* training client; this client moves to it (the
        operations already submitted finish on the old one, in order)."""
        where = "load_state_with_optimizer" if with_optimizer else "load_state"
        sdk = self._service.sdk
        create = sdk.create_training_client_from_state_with_optimizer if with_optimizer else sdk.create_training_client_from_state
        new = call(lambda: create(path).result(), where)
        with self._lock:
            self._sdk = new
            self.name = new.model_id
        return APIFuture.completed(LoadStateResponse(model_package_arn=path), operation=where)

    def _publish(self, description: str, merge_weights: bool) -> TinkerSamplingClient:
        """A sampler on the current weights (Tinker's ephemeral sampler weights)."""
        with self._lock:
            self._check()
            fut = call(lambda: self._sdk.save_weights_and_get_sampling_client(), "save_weights_and_get_sampling_client")
        sdk_sampler = call(lambda: fut.result(), "save_weights_and_get_sampling_client")
        return TinkerSamplingClient(sdk_sampler, self.get_tokenizer)

    def _sampler(self, checkpoint: str) -> TinkerSamplingClient:
        """A sampler on a ``tinker://`` checkpoint (``""`` = the base model)."""
        if not checkpoint:
            return self._service.create_sampling_client(base_model=self.base_model)
        sdk_sampler = call(lambda: self._sdk.create_sampling_client(checkpoint).result(), "create_sampling_client")
        return TinkerSamplingClient(sdk_sampler, self.get_tokenizer)

    def _stop(self) -> None:
        """(A Tinker training run ends with its service session, which
        :meth:`TinkerService.close` finishes.)"""
        self._service._forget(self)
