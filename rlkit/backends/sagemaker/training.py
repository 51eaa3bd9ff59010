"""The SageMaker training client: rlkit's ``TrainingClient`` over the SDK's.

Arguments are validated here, before anything is queued, with the same one-line errors as the
local backend (a wrong per-token length names the datum and the key), plus the service's own
limits the SDK leaves to the service (``learning_rate <= 0.01``, ``grad_clip_norm <= 100``, ...).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from rlkit.backends.sagemaker import convert, names
from rlkit.backends.sagemaker.sampling import SageMakerSamplingClient
from rlkit.errors import ClientStoppedError, InvalidInputError
from rlkit.futures import APIFuture
from rlkit.losses.base import Loss
from rlkit.losses.builtin import BUILTIN_LOSSES, builtin_loss
from rlkit.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    LoadStateResponse,
    OptimStepResponse,
    SaveStateResponse,
    SaveWeightsResponse,
    TokenUsage,
)

if TYPE_CHECKING:
    from rlkit.backends.sagemaker.adapter import SageMakerServiceClient

#: AdamParamsConfig limits of the runtime model (botocore checks only the lower bounds).
ADAM_LIMITS = {
    "learning_rate": (0.0, 0.01),
    "beta1": (0.0, 0.999999),
    "beta2": (0.0, 0.999999),
    "eps": (1e-16, 0.01),
    "weight_decay": (0.0, 1.0),
    "grad_clip_norm": (0.0, 100.0),
    "lora_plus_lr_ratio": (1.0, 100.0),
}


def check_adam(params: AdamParams) -> None:
    for key, (lo, hi) in ADAM_LIMITS.items():
        value = getattr(params, key)
        if value is not None and not lo <= value <= hi:
            raise InvalidInputError(f"optim_step: AdamParams.{key}={value} is outside the SageMaker service's range [{lo:g}, {hi:g}]")


class SageMakerTrainingClient:
    """A LoRA training session on SageMaker (see :mod:`rlkit.backends.sagemaker.adapter`)."""

    def __init__(self, service: "SageMakerServiceClient", sdk: Any, *, base_model: str, rank: int, alpha: int):
        self._service = service
        self._sdk = sdk
        self.name = sdk.training_session_name
        self.training_session_name = self.name
        self.base_model = base_model
        self.rank, self.alpha = rank, alpha
        self.steps = 0
        self._stopped = False
        self._lock = threading.RLock()

    # -- helpers ----------------------------------------------------------------------------------
    def get_tokenizer(self) -> Any:
        return self._service.get_tokenizer(self.base_model)

    def _check(self) -> None:
        if self._stopped:
            raise ClientStoppedError(f"training client {self.name!r} was stopped; create a new one")

    def _submit(self, call, parse, operation: str) -> APIFuture:
        with self._lock:
            self._check()
            return self._service.submit(call, parse, operation, self.name)

    def supports_builtin_loss(self, name: str, config: Optional[Dict[str, float]] = None) -> bool:
        """The four built-in losses run natively (with their ``loss_fn_config`` keys)."""
        key = getattr(name, "value", name)
        if key not in BUILTIN_LOSSES:
            return False
        return set(config or {}) <= set(BUILTIN_LOSSES[key][1])

    def _prepare(self, batch: Sequence[Any], loss_fn: Any, loss_fn_inputs: Any, loss_fn_config: Any, where: str):
        if not isinstance(batch, (list, tuple)):
            raise InvalidInputError(f"{where}: batch must be a list of Datum, got {type(batch).__name__}")
        data: List[Datum] = []
        for i, item in enumerate(batch):
            if isinstance(item, dict):
                item = Datum(**item)
            if not isinstance(item, Datum):
                raise InvalidInputError(f"{where}: batch[{i}] is a {type(item).__name__}, not a Datum")
            if not item.loss_fn_inputs and loss_fn_inputs:
                item = Datum(model_input=item.model_input, loss_fn_inputs=dict(loss_fn_inputs))
            data.append(item)
        name = getattr(loss_fn, "value", loss_fn)
        builtin_loss(name, loss_fn_config).validate(data)  # unknown name/config, keys, lengths, finiteness
        return data, name

    def _forward(self, batch, loss_fn, loss_fn_inputs, loss_fn_config, backward: bool) -> APIFuture[ForwardBackwardOutput]:
        where = "forward_backward" if backward else "forward"
        if isinstance(loss_fn, Loss):
            return self._loss_object(batch, loss_fn, loss_fn_config, backward)
        data, name = self._prepare(batch, loss_fn, loss_fn_inputs, loss_fn_config, where)
        method = self._sdk.forward_backward if backward else self._sdk.forward
        config = dict(loss_fn_config) if loss_fn_config else None
        service = self._service

        def parse_chunk(n_tokens: int):
            def parse(out: Any) -> ForwardBackwardOutput:
                raw = getattr(out, "_raw", None) or {}
                sub = raw.get("forwardBackward") or raw.get("forward") or {"metrics": out.metrics, "lossFnOutputs": out.loss_fn_outputs}
                result = convert.wire_to_forward_output(sub)
                if not result.usage.train_tokens:
                    result.usage = TokenUsage(train_tokens=n_tokens)
                return result

            return parse

        def finish(result: ForwardBackwardOutput) -> ForwardBackwardOutput:
            if service.billing_metrics:
                billed = service.billing(self.name)
                result.metrics.update({f"billing/{k}": float(v) for k, v in billed.items()})
            return result

        # A request has a size limit. The SDK would split a large batch itself, but then averages
        # the chunks' metrics (loss:sum would be a mean); split here, on the SDK's own bounds, and
        # merge as the local engine merges micro-batches. Chunks take consecutive sequence numbers
        # (the lock), so gradients accumulate over exactly this batch.
        chunks = _chunks(data)
        with self._lock:
            futures = []
            for chunk in chunks:
                wire = [convert.datum_to_wire(d) for d in chunk]
                n_tokens = sum(d.model_input.length for d in chunk)
                futures.append(self._submit(lambda w=wire: method(w, name, loss_fn_config=config), parse_chunk(n_tokens), where))
        if len(futures) == 1:
            return futures[0].then(finish, operation=where)
        return _gather(futures, where).then(lambda parts: finish(merge_outputs(parts)), operation=where)

    def _loss_object(self, batch, loss: Loss, loss_fn_config, backward: bool) -> APIFuture[ForwardBackwardOutput]:
        """A :class:`Loss` object goes through rlkit's one dispatch path (native when it is a
        supported built-in, else linearised): :func:`rlkit.losses.run_loss` / ``score_loss``."""
        from rlkit.losses.execute import run_loss, score_loss

        if loss_fn_config:
            raise InvalidInputError("loss_fn_config applies to built-in names only; configure the Loss object")
        data = [Datum(**d) if isinstance(d, dict) else d for d in batch]
        return run_loss(self, data, loss) if backward else score_loss(self, data, loss)

    # -- training ---------------------------------------------------------------------------------
    def forward_backward(self, batch, loss_fn: Any = "cross_entropy", loss_fn_inputs=None, loss_fn_config=None) -> APIFuture[ForwardBackwardOutput]:
        """Forward + backward on the service; gradients accumulate until ``optim_step``."""
        return self._forward(batch, loss_fn, loss_fn_inputs, loss_fn_config, backward=True)

    def forward(self, batch, loss_fn: Any = "cross_entropy", loss_fn_inputs=None, loss_fn_config=None) -> APIFuture[ForwardBackwardOutput]:
        """The same outputs as ``forward_backward``, without gradient."""
        return self._forward(batch, loss_fn, loss_fn_inputs, loss_fn_config, backward=False)

    def optim_step(self, adam_params: Optional[AdamParams | Dict[str, Any]] = None) -> APIFuture[OptimStepResponse]:
        params = AdamParams.coerce(adam_params, "optim_step: adam_params")
        check_adam(params)
        wire = {k: v for k, v in params.model_dump().items() if v is not None}

        def parse(out: Any) -> OptimStepResponse:
            self.steps += 1
            return OptimStepResponse(metrics={k: float(v) for k, v in (out.metrics or {}).items() if isinstance(v, (int, float))})

        return self._submit(lambda: self._sdk.optim_step(wire), parse, "optim_step")

    # -- checkpoints ------------------------------------------------------------------------------
    def _description(self, description: str) -> str:
        return names.tag_description(description, self.rank, self.alpha)

    def save_state(self, description: str = "", *, name: Optional[str] = None, overwrite: bool = False, ttl_seconds: Optional[int] = None) -> APIFuture[SaveStateResponse]:
        """Save adapter + optimizer as a model package; the future resolves to its ARN.
        (``name``/``overwrite``/``ttl_seconds`` have no SageMaker equivalent and are ignored.)"""
        desc = self._description(description)
        return self._submit(lambda: self._sdk.save_state(desc), lambda out: SaveStateResponse(model_package_arn=_arn(out, "save_state")), "save_state")

    def save_weights_for_sampler(self, description: str = "", merge_weights: bool = False, *, name: Optional[str] = None, ttl_seconds: Optional[int] = None) -> APIFuture[SaveWeightsResponse]:
        """Save the adapter only (what a sampler needs) as a model package."""
        desc = self._description(description)
        return self._submit(
            lambda: self._sdk.save_weights_for_sampler(desc, merge_weights),
            lambda out: SaveWeightsResponse(model_package_arn=_arn(out, "save_weights_for_sampler")),
            "save_weights_for_sampler",
        )

    def load_state(self, model_package_arn: str) -> APIFuture[LoadStateResponse]:
        """Load a checkpoint's weights; the optimizer starts fresh."""
        return self._submit(lambda: self._sdk.load_state(model_package_arn), lambda out: LoadStateResponse(model_package_arn=model_package_arn), "load_state")

    def load_state_with_optimizer(self, model_package_arn: str) -> APIFuture[LoadStateResponse]:
        """Load a ``save_state`` checkpoint's weights and optimizer state."""
        return self._submit(
            lambda: self._sdk.load_state_with_optimizer(model_package_arn),
            lambda out: LoadStateResponse(model_package_arn=model_package_arn),
            "load_state_with_optimizer",
        )

    def save_weights_and_get_sampling_client(self, description: str = "", merge_weights: bool = False, *, name: Optional[str] = None) -> SageMakerSamplingClient:
        """Save the weights, point the session's sampler at them, return a client bound to them."""
        arn = self.save_weights_for_sampler(description, merge_weights).result().model_package_arn
        return self.create_sampling_client(arn, _load=True)

    def create_sampling_client(self, model_package_arn: str = "", *, _load: bool = False) -> SageMakerSamplingClient:
        """A sampler on this session: a saved checkpoint, or ``""`` for the base model."""
        self._check()
        try:
            if _load:
                self._sdk._load_weights_for_sampling(model_package_arn)  # what the SDK's save_weights_and_get_sampling_client does
            sdk_sc = self._sdk.create_sampling_client(model_package_arn)
        except Exception as exc:  # noqa: BLE001
            from rlkit.backends.sagemaker.sampling import translate

            raise translate(exc, self._service, self.name, "create_sampling_client") from exc
        return SageMakerSamplingClient(self._service, sdk_sc, base_model=self.base_model, owns_session=False)

    def billing(self) -> Dict[str, int]:
        """This session's cumulative ``BillableTokenUsage``."""
        return self._service.billing(self.name)

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.steps

    def stop(self) -> None:
        """Let queued operations reach the service, then stop the session. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._service._stop_sdk(self._sdk, self.name)

    def __enter__(self) -> "SageMakerTrainingClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _chunks(data: Sequence[Datum]) -> List[List[Datum]]:
    """``data`` split on the SDK's request bounds (datums per request, estimated bytes)."""
    try:
        from sagemaker.train.training_session._utils import MAX_CHUNK_BYTES, MAX_CHUNK_LEN
    except ImportError:  # pragma: no cover - other SDK versions
        MAX_CHUNK_LEN, MAX_CHUNK_BYTES = 1024, 10_000_000
    chunks: List[List[Datum]] = [[]]
    size = 0
    for d in data:
        est = 10 * d.model_input.length * (1 + len(d.loss_fn_inputs))  # the SDK's estimate: ~10 bytes per value
        if chunks[-1] and (size + est > MAX_CHUNK_BYTES or len(chunks[-1]) >= MAX_CHUNK_LEN):
            chunks.append([])
            size = 0
        chunks[-1].append(d)
        size += est
    return chunks


def merge_outputs(parts: Sequence[ForwardBackwardOutput]) -> ForwardBackwardOutput:
    """Chunks of one batch as one output: ``:mean`` metrics weighted by ``tokens:weighted``,
    everything else summed (the local engine's micro-batch rule); outputs concatenated."""
    metrics: Dict[str, float] = {}
    weights: Dict[str, float] = {}
    for part in parts:
        n = part.metrics.get("tokens:weighted", 0.0)
        for key, value in part.metrics.items():
            if key.endswith(":mean"):
                if n:
                    prev = weights.get(key, 0.0)
                    metrics[key] = (metrics.get(key, 0.0) * prev + value * n) / (prev + n)
                    weights[key] = prev + n
            elif key in ("grad_norm", "learning_rate", "step"):
                metrics[key] = value
            else:
                metrics[key] = metrics.get(key, 0.0) + value
    usage = TokenUsage()
    for part in parts:
        usage = usage + part.usage
    return ForwardBackwardOutput(
        loss_fn_outputs=[o for part in parts for o in part.loss_fn_outputs], metrics=metrics, usage=usage,
    )


def _gather(futures: List[APIFuture], operation: str) -> APIFuture:
    """A future of every result, in order (the first error wins); waits without holding a thread."""
    out: APIFuture = APIFuture(operation=operation)
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(_f: APIFuture) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            out.set_exception(errors[0])
        else:
            out.set_result([f.result() for f in futures])

    for f in futures:
        f.add_done_callback(done)
    return out


def _arn(out: Any, operation: str) -> str:
    arn = out.model_package_arn
    if not arn:
        from rlkit.errors import OperationError

        raise OperationError(f"{operation}: the service completed the save but returned no model package ARN")
    return arn
