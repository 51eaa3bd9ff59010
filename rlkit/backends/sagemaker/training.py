"""The SageMaker training client: rlkit's ``TrainingClient`` over the SDK's.

Arguments are validated here, before anything is queued, with the same one-line errors as the
local backend (a wrong per-token length names the datum and the key), plus the service's own
limits the SDK leaves to the service (``learning_rate <= 0.01``, ``grad_clip_norm <= 100``, ...).

Results read the same on either reading of the service (:mod:`.outputs`): the SDK's documented
``actor/*`` metrics or rlkit's own, per-token logprobs returned or scored with the session
(:mod:`.scoring`).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from rlkit.backends.sagemaker import convert, names, outputs, scoring
from rlkit.backends.sagemaker.sampling import SageMakerSamplingClient
from rlkit.backends.sagemaker.scoring import Weights
from rlkit.backends.sagemaker.capabilities import SAGEMAKER_CAPABILITIES
from rlkit.engine.capabilities import Capabilities
from rlkit.engine.clients import TrainingClientBase
from rlkit.errors import InvalidInputError, OperationError
from rlkit.futures import APIFuture
from rlkit.losses.base import Loss
from rlkit.losses.builtin import builtin_call
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
    from rlkit.backends.sagemaker.service import SessionService

log = logging.getLogger("rlkit.sagemaker")

class SageMakerTrainingClient(TrainingClientBase):
    """A LoRA training session on SageMaker (see :mod:`rlkit.backends.sagemaker.adapter`): the
    primitives of :class:`rlkit.engine.clients.TrainingClientBase`, which owns every check (the service's
    ``AdamParams`` ranges are declared in ``capabilities.adam_limits``) and the routing of a loss.

    Besides forwarding each call to the SDK, it keeps what the service does not hand back:

    - a **weight version** (``optim_step`` and ``load_state*`` move it) and the ``saveWeights``
      package of the current version, if any: what scoring and publishing read (:mod:`.scoring`);
    - where the trainer's logprobs come from, decided once per session from its first
      ``forward``/``forward_backward`` result that wants them (``backend.trainer_logprobs``); a
      ``forward_backward`` wants them only when asked (``return_logprobs=True``), since the service
      computes the built-in losses itself and scoring costs a ``compute_logprobs`` round trip;
    - the gradient norm: the service reports ``actor/grad_norm`` with ``forward_backward`` and
      nothing of the kind with ``optim_step``, so ``optim_step`` results carry the last pass's;
    - the first failed submit: the SDK has already spent its sequence number, so the service
      blocks on the gap and nothing later can run; later calls raise that first error at once.
    """

    #: ``forward_backward(..., return_logprobs=True)``: the trainer's per-token logprobs are wanted
    extensions = frozenset({"return_logprobs"})

    def __init__(self, service: "SessionService", sdk: Any, *, base_model: str, rank: int, alpha: int):
        super().__init__(sdk.training_session_name, base_model)
        self._service = service
        self._sdk = sdk
        self.training_session_name = self.name
        self.rank, self.alpha = rank, alpha
        self._version = 0
        self._weights: Optional[Weights] = None
        source = service.trainer_logprobs
        self.logprobs_source: Optional[str] = None if source == "auto" else source
        self._broken: Optional[BaseException] = None
        self._since_step: List[APIFuture] = []  # the last chunk of each forward_backward since optim_step
        self._warned_temperature = False
        self._ephemeral: List[Weights] = []  # packages rlkit saved for itself and has not deleted yet
        self.scored_tokens = 0  # prefill tokens spent scoring trainer logprobs (this session)
        self.scoring_saves = 0  # packages saved only to score them

    # -- helpers ----------------------------------------------------------------------------------
    def get_tokenizer(self) -> Any:
        return self._service.get_tokenizer(self.base_model)

    def _check(self) -> None:
        super()._check()
        if self._broken is not None:
            raise OperationError(
                f"training session {self.name} cannot run more operations: an earlier operation never reached the service "
                f"({self._broken}), so the session waits for it. Stop it and resume from the last checkpoint"
            )

    def _note_failure(self, err: BaseException, sdk_future: Any) -> None:
        """A training submit that failed for good leaves a gap in the session's sequence numbers."""
        submit = getattr(sdk_future, "_submit_future", None)  # the SDK's PendingAPIFuture: submit, then poll
        if submit is not None and submit.done() and submit.exception() is not None and self._broken is None:
            self._broken = err

    def _submit(self, call, parse, operation: str) -> APIFuture:
        with self._lock:
            self._check()
            return self._service.submit(call, parse, operation, self.name, on_error=self._note_failure)

    @property
    def capabilities(self) -> Capabilities:
        return SAGEMAKER_CAPABILITIES

    def _pass(self, data: List[Datum], loss: Loss, backward: bool, want_logprobs: bool) -> APIFuture[ForwardBackwardOutput]:
        """The built-in ``loss`` is, sent by its name and ``loss_fn_config`` (as the call gave them)."""
        where = "forward_backward" if backward else "forward"
        want_logprobs = want_logprobs or self._service.always_score_logprobs
        method = self._sdk.forward_backward if backward else self._sdk.forward
        name, loss_fn_config = builtin_call(loss)
        config = dict(loss_fn_config) if loss_fn_config else None

        def parse_chunk(n_tokens: int):
            def parse(out: Any) -> ForwardBackwardOutput:
                raw = getattr(out, "_raw", None) or {}
                sub = raw.get("forwardBackward") or raw.get("forward") or {"metrics": out.metrics, "lossFnOutputs": out.loss_fn_outputs}
                result = convert.wire_to_forward_output(sub)
                if not result.usage.train_tokens:
                    result.usage = TokenUsage(train_tokens=n_tokens)
                return result

            return parse

        # A request has a size limit. Split here, on the SDK's own bounds (so the SDK never splits
        # again), and fold the chunks as the SDK does (:func:`.outputs.merge_chunks`). Chunks take
        # consecutive sequence numbers (the lock), so gradients accumulate over exactly this batch.
        chunks = _chunks(data)
        with self._lock:
            self._check()
            futures = []
            for chunk in chunks:
                wire = [convert.datum_to_wire(d) for d in chunk]
                n_tokens = sum(d.model_input.length for d in chunk)
                futures.append(self._submit(lambda w=wire: method(w, name, loss_fn_config=config), parse_chunk(n_tokens), where))
            if backward:
                self._since_step.append(futures[-1])
            if self.logprobs_source is None and want_logprobs:
                # The session's first pass decides where trainer logprobs come from. Nothing else
                # is queued behind it yet, so a scoring save made now still sees these weights.
                try:
                    parts = [f.result(timeout=self._service.operation_timeout_s) for f in futures]
                except BaseException as exc:  # noqa: BLE001 - delivered through the future
                    failed: APIFuture = APIFuture(operation=where)
                    failed.set_exception(exc)
                    return failed
                returned = all(outputs.has_logprobs(p, c) for p, c in zip(parts, chunks))
                self.logprobs_source = "service" if returned else "scoring"
                log.info("SageMaker session %s: trainer logprobs %s", self.name,
                         "come with the service's results" if returned else "are scored with compute_logprobs (see docs/sagemaker.md)")
            scoring_due = want_logprobs and self.logprobs_source == "scoring"
            weights, saved = (self._scoring_weights() if scoring_due else (None, False))

        def complete() -> ForwardBackwardOutput:
            return self._complete(futures, chunks, data, loss, backward, weights, saved, want_logprobs)

        return self._service.run(complete, where, self.name)

    def _complete(self, futures, chunks, data, loss, backward, weights, saved, want_logprobs=True) -> ForwardBackwardOutput:
        """Fold the chunks, find or score the trainer's logprobs (when wanted), add the metrics loops read."""
        timeout = self._service.operation_timeout_s
        try:
            out = outputs.merge_chunks([f.result(timeout=timeout) for f in futures], [len(c) for c in chunks])
            returned = outputs.has_logprobs(out, data)
            extra = {"logprobs:from_service": float(returned), "logprobs:scored_tokens": 0.0, "logprobs:scoring_saves": 0.0}
            scored = 0
            logprobs = None
            if not want_logprobs and not returned:
                pass  # nobody asked: the service's own results only (no scoring, no save)
            elif weights is None or returned:
                if not outputs.has_logprobs(out, data):
                    raise OperationError(
                        f"{'forward_backward' if backward else 'forward'}: the service returned no per-token logprobs "
                        "(backend.trainer_logprobs=service); use auto or scoring"
                    )
                logprobs = [outputs.service_logprobs(e) for e in out.loss_fn_outputs]
            else:
                if scoring.non_unit_temperature(data):
                    if not backward:
                        raise InvalidInputError(
                            "forward: a datum has a temperature input other than 1, and this service's trainer logprobs are "
                            "scored with compute_logprobs, which has no temperature; score at temperature 1 or use the local backend"
                        )
                    extra["logprobs:temperature_ignored"] = 1.0
                    if not self._warned_temperature:
                        self._warned_temperature = True
                        log.warning("session %s: trainer logprobs are scored at temperature 1 (compute_logprobs has no temperature); "
                                    "the loss itself is computed by the service with the datums' temperature", self.name)
                prompts = [scoring.scoring_prompt(d, i) for i, d in enumerate(data)]
                arn = weights.future.result(timeout=timeout).model_package_arn
                logprobs, scored = scoring.score(self._sdk, arn, prompts, timeout)
                extra.update({"logprobs:from_service": 0.0, "logprobs:scored_tokens": float(scored), "logprobs:scoring_saves": float(saved)})
        finally:
            if weights is not None:
                weights.release(self._delete_weights)
        out = outputs.with_logprobs(out, logprobs) if logprobs is not None else outputs.with_datum_losses(out)
        metrics = outputs.rlkit_metrics(out, data, loss)
        with self._lock:
            self.scored_tokens += scored
            self.scoring_saves += int(saved)
            extra.update({"logprobs:scored_tokens_total": float(self.scored_tokens), "logprobs:scoring_saves_total": float(self.scoring_saves)})
        metrics.update(extra)
        metrics.update({f"billing/{k}": float(v) for k, v in self._service.billing_snapshot(self.name).items()})
        usage = TokenUsage(train_tokens=out.usage.train_tokens, prefill_tokens=scored)
        return ForwardBackwardOutput(loss_fn_output_type=out.loss_fn_output_type, loss_fn_outputs=out.loss_fn_outputs, metrics=metrics, usage=usage)

    # -- training ---------------------------------------------------------------------------------
    #: ``forward_backward`` returns the trainer's per-token logprobs only when asked
    #: (``return_logprobs=True``; :func:`rlkit.losses.run_loss` asks with ``logprobs=True``).
    logprobs_on_request = True

    def _forward_backward(self, data: List[Datum], loss: Loss, *, return_logprobs: bool = False) -> APIFuture[ForwardBackwardOutput]:
        """Forward + backward on the service; gradients accumulate until ``optim_step``.

        The service computes a built-in loss itself and returns no per-token logprobs, so the
        result carries ``loss_fn_outputs[i]["logprobs"]`` only with ``return_logprobs=True`` (then
        scored with the session, :mod:`.scoring`: a ``compute_logprobs`` per distinct datum, and a
        ``saveWeights`` when the current weights have none) or when the service returns them.
        Without, ``metrics["loss:sum"]`` is the batch's loss (from the service's ``actor/pg_loss``)
        and, where the service returns per-datum outputs, each datum's holds its summed loss
        (``"loss"``)."""
        return self._pass(data, loss, backward=True, want_logprobs=bool(return_logprobs))

    def _forward(self, data: List[Datum], loss: Loss) -> APIFuture[ForwardBackwardOutput]:
        """Always with the trainer's per-token logprobs (what a forward pass is for: linearised
        losses, evaluation)."""
        return self._pass(data, loss, backward=False, want_logprobs=True)

    def _optim_step(self, params: AdamParams) -> APIFuture[OptimStepResponse]:
        """One optimizer step. Its metrics carry ``grad_norm`` (the last pass's ``actor/grad_norm``
        when the service reports none here) and ``learning_rate``; after it, the session's bill is
        read once, in the background (``billing/*`` of the next ``forward_backward``)."""
        wire = {k: v for k, v in params.model_dump().items() if v is not None}

        def parse(out: Any, passes: List[APIFuture]) -> OptimStepResponse:
            self.steps += 1
            metrics = {k: float(v) for k, v in (out.metrics or {}).items() if isinstance(v, (int, float))}
            if "grad_norm" not in metrics and passes:
                last = passes[-1].exception(timeout=self._service.operation_timeout_s) is None and passes[-1].result().metrics
                norm = (last or {}).get("grad_norm", (last or {}).get("actor/grad_norm"))
                if norm is not None:
                    metrics["grad_norm"] = float(norm)
            if "learning_rate" not in metrics:
                metrics["learning_rate"] = float(metrics.get("actor/lr", params.learning_rate))
            self._service.refresh_billing(self.name)
            return OptimStepResponse(metrics=metrics)

        with self._lock:
            self._check()
            passes, self._since_step = self._since_step, []
            future = self._submit(lambda: self._sdk.optim_step(wire), lambda out: parse(out, passes), "optim_step")
            self._version += 1
        return future

    # -- checkpoints ------------------------------------------------------------------------------
    def _description(self, description: str) -> str:
        return names.tag_description(description, self.rank, self.alpha, session=self.name)

    def _record(self, kind: str, description: str):
        def parse(out: Any) -> Any:
            arn = _arn(out, "save_state" if kind == "checkpoint" else "save_weights_for_sampler")
            self._service.ledger.package(arn, kind=kind, session=self.name, description=description)
            return arn

        return parse

    def _save(self, kind: str, description: str, *, name: Optional[str], merge_weights: bool, overwrite: bool,
              ttl_seconds: Optional[int]) -> APIFuture:
        """A model package; the future resolves to its ARN (``name``/``overwrite``/``ttl_seconds``
        have no SageMaker equivalent and are ignored). Weights saved here are kept: rlkit never
        deletes a package you asked for."""
        if kind == "weights":
            with self._lock:
                return self._save_weights(description, merge_weights, ephemeral=False).future
        desc = self._description(description)
        record = self._record("checkpoint", desc)
        return self._submit(lambda: self._sdk.save_state(desc), lambda out: SaveStateResponse(model_package_arn=record(out)), "save_state")

    def _save_weights(self, description: str, merge_weights: bool, *, ephemeral: bool) -> Weights:
        """Queue a ``saveWeights`` of the current weight version (lock held) and make it current."""
        desc = self._description(description)
        record = self._record("model", desc)
        future = self._submit(
            lambda: self._sdk.save_weights_for_sampler(desc, merge_weights),
            lambda out: SaveWeightsResponse(model_package_arn=record(out)),
            "save_weights_for_sampler",
        )
        weights = Weights(self._version, future, ephemeral)
        if ephemeral:
            self._ephemeral = [w for w in self._ephemeral if not w.deleted] + [weights]
        previous, self._weights = self._weights, weights
        if previous is not None:
            previous.supersede(self._delete_weights)
        return weights

    def _scoring_weights(self) -> tuple:
        """``(weights of the current version, saved_now)``, acquired for one scoring (lock held)."""
        weights, saved = self._weights, False
        if weights is None or weights.version != self._version or weights.deleted:
            weights, saved = self._save_weights("rlkit: weights for scoring trainer logprobs", False, ephemeral=True), True
        weights.acquire()
        return weights, saved

    def _delete_weights(self, weights: Weights) -> None:
        """Delete an ephemeral package nobody needs any more (in the background, never raising)."""
        self._service.delete_package_later(weights.future)

    def _load(self, model_package_arn: str, with_optimizer: bool) -> APIFuture[LoadStateResponse]:
        """Load a checkpoint's weights (and optimizer state); a new weight version."""
        operation = "load_state_with_optimizer" if with_optimizer else "load_state"
        load = self._sdk.load_state_with_optimizer if with_optimizer else self._sdk.load_state
        with self._lock:
            future = self._submit(lambda: load(model_package_arn), lambda out: LoadStateResponse(model_package_arn=model_package_arn), operation)
            self._version += 1
        return future

    def _publish(self, description: str, merge_weights: bool) -> SageMakerSamplingClient:
        """Save the weights, point the session's sampler at them, return a client bound to them.

        It returns at once: the ``saveWeights`` is queued behind the operations already submitted,
        and the load for sampling follows it in the background, so what the loop submits next (a
        checkpoint, the next pass) is in flight during both; the client's first request waits for
        them (and raises their error). On the service's cadence that saves a poll per publish.

        Publishing every step would leave one model package per step; so unless
        ``backend.keep_published_weights`` is set, a package published here is deleted (the package
        record; its S3 artifacts only with ``backend.delete_artifacts``) once a newer one is
        published and no sampling client on it is left. Checkpoints (``save_state``) and packages
        saved with ``save_weights_for_sampler`` are never deleted."""
        with self._lock:
            weights = self._save_weights(description, merge_weights, ephemeral=not self._service.keep_published_weights)
            weights.acquire()  # until the sampling client below is gone
        timeout = self._service.operation_timeout_s
        sdk = self._sdk

        def load() -> Any:
            arn = weights.future.result(timeout=timeout).model_package_arn
            sdk._load_weights_for_sampling(arn)  # what the SDK's save_weights_and_get_sampling_client does
            return sdk.create_sampling_client(arn)

        pending = self._service.run(load, "save_weights_and_get_sampling_client", self.name)
        client = SageMakerSamplingClient(self._service, pending, base_model=self.base_model, owns_session=False, session=self.name)
        weakref.finalize(client, weights.release, self._delete_weights)
        return client

    def _sampler(self, model_package_arn: str, *, load: bool = False) -> SageMakerSamplingClient:
        """A sampler on this session: a saved checkpoint, or ``""`` for the base model (``load``:
        point the session's sampling path at it first)."""
        try:
            if load:
                self._sdk._load_weights_for_sampling(model_package_arn)  # what the SDK's save_weights_and_get_sampling_client does
            sdk_sc = self._sdk.create_sampling_client(model_package_arn)
        except Exception as exc:  # noqa: BLE001
            from rlkit.backends.sagemaker.errors import translate

            raise translate(exc, self._service, self.name, "create_sampling_client") from exc
        return SageMakerSamplingClient(self._service, sdk_sc, base_model=self.base_model, owns_session=False)

    def billing(self) -> Dict[str, int]:
        """This session's cumulative ``BillableTokenUsage`` (one ``DescribeTrainingSession``)."""
        return self._service.billing(self.name)

    # -- lifecycle --------------------------------------------------------------------------------
    def _stop(self) -> None:
        """Let queued operations reach the service, then stop the session; delete the ephemeral
        packages nobody uses any more."""
        with self._lock:
            self._weights, ephemeral, self._ephemeral = None, self._ephemeral, []
        try:
            self._service._stop_sdk(self._sdk, self.name)
        finally:
            for weights in ephemeral:
                weights.retire(self._delete_weights)


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


def _arn(out: Any, operation: str) -> str:
    arn = out.model_package_arn
    if not arn:
        from rlkit.errors import OperationError

        raise OperationError(f"{operation}: the service completed the save but returned no model package ARN")
    return arn
