"""The runtime's operations, executed on the local engine.

``ExecuteTrainingOperation`` parses the request (a malformed datum or tensor is a
``ValidationException`` at submit, like any other request-shape error), deduplicates it by
``clientToken``, and queues it by ``sequenceNumber``; operations are dispatched to the session's
local training client strictly in sequence order. What the engine refuses while executing (a
per-token loss input of the wrong length, a missing input, a non-finite loss) fails the
*operation*: ``GetTrainingOperationResult`` answers ``status: Failed`` with ``errorDetails``, as
the service does for a request it accepted.

``ExecuteSamplingOperation`` runs concurrently (the local sampler batches concurrent requests);
sampling takes no ``clientToken``, so a retried submit samples again (and is billed again).

``Get*OperationResult`` answers at once on the SDK's cadence (``cadence="sdk"``, the strict
default: the SDK then polls every 2 s, as against the service); with ``cadence="fast"`` it
long-polls, answering as soon as the operation reaches a terminal state (or after
``long_poll_s``), so the SDK sees a finished operation on its first poll.

In strict mode (:mod:`.strict`) results carry the SDK's documented metrics and no per-datum loss
outputs, the first submit after a session turns Running (and the first sampling submit after a
``saveWeights``) meets one transient ``InternalServerException`` (the warm-up the SDK retries
through), and a request to a session that is not Running/Blocked is a 409 ``ConflictException``.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any, Dict, Optional

from rlkit.backends.http_service import BadRequestBody, load_json
from rlkit.backends.sagemaker import convert
from rlkit.backends.sagemaker.emulator import strict
from rlkit.backends.sagemaker.emulator.shapes import ServiceError, validation
from rlkit.backends.sagemaker.emulator.state import EmulatorState, Operation, Session
from rlkit.chat import prompt_tokens
from rlkit.errors import RlkitError
from rlkit.types import SamplingParams

TRAINING_KINDS = ("forward", "forwardBackward", "optimizerStep", "saveWeights", "saveState", "loadState")


def _one(config: Dict[str, Any]) -> str:
    (kind,) = [k for k, v in config.items() if v is not None]
    return kind


def _error_text(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, RlkitError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:2000]


MAX_SEED = 2**63 - 1  # the sampler's generators take a signed 64-bit seed


def _integer(value: Any, where: str, lo: int, hi: Optional[int], optional: bool = False) -> Optional[int]:
    """``value`` as an integer in ``[lo, hi]`` (a ValidationException naming ``where`` otherwise)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise validation(f"Value {shown} at '{where}' failed to satisfy constraint: Member must be an integer in [{lo}, {hi if hi is not None else 'inf'}]")
    return value


def _vocab(sampler: Any) -> Optional[int]:
    worker = getattr(getattr(sampler, "_runtime", None), "sampler", None)
    return getattr(getattr(worker, "sampler", None), "vocab_size", None)


def _digest(config: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


class Runtime:
    def __init__(self, state: EmulatorState):
        self.state = state

    def _warm_up(self, session: Session, sampling: bool) -> None:
        """Strict: the runtime of a session that just turned Running (or whose sampler is binding
        a just-saved checkpoint) is briefly unavailable; the SDK retries its submits through it."""
        with session.lock:
            attr = "sampling_warmup_left" if sampling and session.sampling_warmup_left else "warmup_left"
            if getattr(session, attr) <= 0 or session.status not in ("Running", "Blocked"):
                return
            setattr(session, attr, getattr(session, attr) - 1)
        self.state.stats["warmup_errors"] += 1
        raise ServiceError("InternalServerException", f"Training session {session.name} is not ready to accept requests yet; retry", 500)

    # -- training ---------------------------------------------------------------------------------
    def execute_training(self, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        state = self.state
        session = state.session(name, runtime=True)
        self._warm_up(session, sampling=False)
        seq, token = int(body["sequenceNumber"]), body.get("clientToken")
        config = body["operationConfig"]
        kind = _one(config)
        with session.lock:
            content = _digest(config)
            if token and token in session.by_token:
                op_id, first_seq, first_content = session.by_token[token]
                if first_seq != seq:
                    raise ServiceError("ConflictException", f"clientToken {token} was already used with sequenceNumber {first_seq}, not {seq}")
                if first_content != content:
                    state.stats["conflicting_submits"] += 1
                    raise ServiceError("ConflictException", f"clientToken {token} (sequenceNumber {seq}) was already used for a different operation ({op_id})")
                state.stats["duplicate_submits"] += 1
                return {"operationId": op_id}
            session.require_runtime(state.options.strict)
            if seq in session.by_seq:
                raise ServiceError("ConflictException", f"sequenceNumber {seq} of training session {name} was already submitted with another clientToken")
            if seq < session.next_seq:
                raise ServiceError("ConflictException", f"sequenceNumber {seq} is behind the session's next expected sequence number {session.next_seq}")
            op = Operation(id=state.new_op_id("train"), kind=kind, config=config[kind], seq=seq, token=token)
            op.parsed = self._parse_training(kind, op.config, session)
            session.remember(session.ops, op)
            session.by_seq[seq] = token or ""
            if token:
                session.by_token[token] = (op.id, seq, content)
            session.waiting[seq] = op
            session.last_received_seq = max(session.last_received_seq, seq)
            state.stats["training_ops_received"] += 1
            self._dispatch_ready(session)
        return {"operationId": op.id}

    def _parse_training(self, kind: str, cfg: Dict[str, Any], session: Session) -> Any:
        try:
            if kind in ("forward", "forwardBackward"):
                return [convert.wire_to_datum(d) for d in cfg["datumList"]]
            if kind == "optimizerStep":
                return convert.wire_to_adam(cfg["adamParamsConfig"])
            if kind == "loadState":
                return self.state.package(cfg["modelPackageArn"])
        except ServiceError:
            raise
        except (RlkitError, KeyError, TypeError, ValueError) as exc:
            raise validation(f"Invalid {kind} configuration: {_error_text(exc)}") from None
        return None

    def _dispatch_ready(self, session: Session) -> None:
        """Hand every operation whose predecessors have all arrived to the engine (lock held)."""
        state = self.state
        while session.next_seq in session.waiting:
            op = session.waiting.pop(session.next_seq)
            session.next_seq += 1
            limit = state.options.expire_after_ops
            if limit is not None and session.dispatched >= limit:
                session.waiting[op.seq] = op  # skipped when the session ends
                state.begin_expire(session, f"Training session {session.name} expired (injected after {limit} operations)")
                return
            session.dispatched += 1
            op.status = "InProgress"
            self._start(session, op)
        session.update_blocked()

    def _start(self, session: Session, op: Operation) -> None:
        trainer = session.trainer
        cfg = op.config
        started = time.perf_counter()
        strict_mode = self.state.options.strict
        try:
            if op.kind in ("forward", "forwardBackward"):
                backward = op.kind == "forwardBackward"
                data = op.parsed
                run = trainer.forward_backward if backward else trainer.forward
                future = run(data, cfg["lossFnName"], loss_fn_config=cfg.get("lossFnConfig"))
                if strict_mode:
                    norm = trainer.gradient_norm() if backward else None  # runs right behind the pass
                    finished = norm if norm is not None else future

                    def on_done(s, o, _r, future=future, norm=norm, data=data):
                        return self._strict_forward_done(s, o, future, norm, data, time.perf_counter() - started)

                    future, fb_future = finished, future
                else:
                    fb_future = None
                    on_done = self._forward_done
            elif op.kind == "optimizerStep":
                future = trainer.optim_step(op.parsed)
                fb_future = None
                if strict_mode:
                    on_done = lambda s, o, r, lr=op.parsed.learning_rate: strict.optim_result(lr)  # noqa: E731
                else:
                    on_done = lambda s, o, r: {"metrics": {k: float(v) for k, v in r.metrics.items()}}  # noqa: E731
            elif op.kind in ("saveState", "saveWeights"):
                desc = cfg.get("description") or ""
                future = trainer.save_state(desc) if op.kind == "saveState" else trainer.save_weights_for_sampler(desc)
                fb_future = None
                on_done = self._saved
            else:  # loadState
                package = op.parsed
                if package.local_model != session.local_model:
                    raise validation(f"Model package {package.arn} was trained on {package.hub_name}, not on this session's base model")
                if cfg["loadOptimizer"] and package.kind != "checkpoint":
                    raise validation(f"Model package {package.arn} holds weights only (saveWeights); loading the optimizer needs a saveState checkpoint")
                future = (trainer.load_state_with_optimizer if cfg["loadOptimizer"] else trainer.load_state)(package.local_id)
                fb_future = None
                on_done = lambda s, o, r: {}  # noqa: E731
        except Exception as exc:  # noqa: BLE001 - refused by the engine: the operation fails
            self._failed(session, op, exc)
            return
        future.add_done_callback(lambda f: self._complete(session, op, fb_future or f, on_done))

    def _complete(self, session: Session, op: Operation, future: Any, on_done: Any) -> None:
        try:
            exc = future.exception()
            if exc is not None:
                self._failed(session, op, exc)
                return
            result = on_done(session, op, future.result())
        except concurrent.futures.CancelledError:  # queued on the engine when the session ended (or its
            op.parsed = None                        # strict gradient norm was): it never completed
            op.finish("Skipped", error=f"Training session {session.name} ended ({session.status}) before this operation ran")
            return
        except BaseException as err:  # noqa: BLE001 - every operation reaches a terminal status
            self._failed(session, op, err)
            return
        with session.lock:
            session.executed_seqs.append(op.seq)
        self.state.stats["training_ops_executed"] += 1
        op.parsed = None  # the request's datums are not needed any more
        op.finish("Completed", result)

    def _failed(self, session: Session, op: Operation, exc: BaseException) -> None:
        with session.lock:
            session.executed_seqs.append(op.seq)
        self.state.stats["training_ops_failed"] += 1
        op.parsed = None
        op.finish("Failed", error=_error_text(exc))

    def _forward_done(self, session: Session, op: Operation, out: Any) -> Dict[str, Any]:
        tokens = int(out.usage.train_tokens)
        with session.lock:
            session.billing["training"] += tokens
        op.usage = {"trainingTokens": tokens}
        return convert.forward_result_to_wire(out)

    def _strict_forward_done(self, session: Session, op: Operation, future: Any, norm: Any, data: Any, seconds: float) -> Dict[str, Any]:
        out = future.result()
        tokens = int(out.usage.train_tokens)
        with session.lock:
            session.billing["training"] += tokens
        op.usage = {"trainingTokens": tokens}
        cfg = op.config
        return strict.forward_result(
            out, data, cfg["lossFnName"], cfg.get("lossFnConfig"), backward=op.kind == "forwardBackward",
            grad_norm=norm.result() if norm is not None else None, num_parameters=session.num_parameters,
            seconds=seconds, outputs=self.state.options.outputs,
        )

    def _saved(self, session: Session, op: Operation, response: Any) -> Dict[str, Any]:
        kind = "checkpoint" if op.kind == "saveState" else "model"
        package = self.state.register_package(session, kind, response.model_package_arn, op.config.get("description") or "")
        if kind == "model":
            with session.lock:
                session.sampling_warmup_left = self.state.options.warmups
        return {"modelPackageArn": package.arn}

    def get_training(self, name: str, op_id: str) -> Dict[str, Any]:
        return self._get(name, op_id, sampling=False)

    # -- sampling ---------------------------------------------------------------------------------
    def _sampler(self, session: Session, package_arn: Optional[str]) -> Any:
        local = self.state.local
        if package_arn:
            package = self.state.package(package_arn)
            if package.local_model != session.local_model:
                raise validation(f"Model package {package_arn} was trained on {package.hub_name}, not on this session's base model")
            return local.create_sampling_client(model_package_arn=package.local_id)
        if session.sampling_weights:
            return local.create_sampling_client(model_package_arn=session.sampling_weights)
        return local.create_sampling_client(base_model=session.local_model)

    def execute_sampling(self, name: str, body: Dict[str, Any]) -> Dict[str, Any]:
        state = self.state
        session = state.session(name, runtime=True)
        self._warm_up(session, sampling=True)
        session.require_runtime(state.options.strict)
        config = body["operationConfig"]
        kind = _one(config)
        cfg = config[kind]
        op = Operation(id=state.new_op_id("sample"), kind=kind, config=cfg, status="InProgress")
        try:
            if kind == "loadWeightsForSampling":
                package = state.package(cfg["modelPackageArn"])
                self._sampler(session, package.arn)  # same checks as a sample against it
                with session.lock:
                    session.sampling_weights = package.local_id
                op.finish("Completed", {})
                future = None
            elif kind == "sample":
                tokens = convert.wire_to_model_input(cfg["prompt"]).to_ints()
                raw = cfg["samplingParams"]
                _integer(raw.get("seed"), "samplingParams.seed", 0, MAX_SEED, optional=True)
                num_samples = _integer(cfg["numSamples"], "numSamples", 1, state.options.max_num_samples)
                params = convert.wire_to_sampling_params(raw)
                sampler = self._sampler(session, cfg.get("modelPackageArn"))
                topk = _integer(cfg.get("topkPromptLogprobs"), "topkPromptLogprobs", 1, _vocab(sampler), optional=True)
                future = sampler.sample(
                    tokens, num_samples, params,
                    include_prompt_logprobs=bool(cfg.get("includePromptLogprobs")),
                    topk_prompt_logprobs=topk,
                )
            else:  # computeLogprobs
                tokens = convert.wire_to_model_input(cfg["prompt"]).to_ints()
                future = self._sampler(session, cfg.get("modelPackageArn")).compute_logprobs(tokens)
                op.parsed = len(tokens)
        except ServiceError:
            raise
        except (RlkitError, KeyError, TypeError, ValueError) as exc:
            raise validation(f"Invalid {kind} request: {_error_text(exc)}") from None
        with session.lock:
            session.remember(session.sampling_ops, op)
        state.stats["sampling_ops_received"] += 1
        if future is not None:
            state.track_sampling(session, op.id, op, future)  # the session's end cancels it
            future.add_done_callback(lambda f: self._sampled(session, op, f))
        return {"operationId": op.id}

    def _sampled(self, session: Session, op: Operation, future: Any) -> None:
        try:
            self._record_sample(session, op, future)
        except BaseException as err:  # noqa: BLE001 - every operation reaches a terminal status
            op.finish("Failed", error=_error_text(err))

    def _record_sample(self, session: Session, op: Operation, future: Any) -> None:
        exc = future.exception()
        if exc is not None:
            op.finish("Failed", error=_error_text(exc))
            return
        result = future.result()
        with session.lock:
            if op.kind == "sample":
                session.billing["prefill"] += result.usage.prefill_tokens
                session.billing["sample"] += result.usage.decode_tokens
            else:
                session.billing["prefill"] += op.parsed
        self.state.stats["sampling_ops_executed"] += 1
        op.finish("Completed", convert.sample_response_to_wire(result) if op.kind == "sample" else {"logprobs": result})

    def get_sampling(self, name: str, op_id: str) -> Dict[str, Any]:
        return self._get(name, op_id, sampling=True)

    def _get(self, name: str, op_id: str, sampling: bool) -> Dict[str, Any]:
        """``Get{Training,Sampling}OperationResult``: the operation's poll, or ResourceNotFound."""
        session = self.state.session(name, runtime=True)
        op = (session.sampling_ops if sampling else session.ops).get(op_id)
        if op is None:
            what = "Sampling operation" if sampling else "Operation"
            raise ServiceError("ResourceNotFoundException", f"{what} {op_id} does not exist in training session {name}")
        return self._poll(op)

    def _poll(self, op: Operation) -> Dict[str, Any]:
        """One ``Get*OperationResult``. Fast cadence: wait up to ``long_poll_s`` for the end. SDK
        cadence: answer at once, and answer the first poll with the operation still running (a
        service's operation is never done within one round trip of its submit), so the SDK's own
        2 s polling always runs."""
        opts = self.state.options
        op.polls += 1
        if opts.pace == "sdk" and op.polls == 1:
            return {"status": "Pending" if op.status == "Pending" else "InProgress"}
        op.done.wait(opts.result_wait_s)
        return op.wire()

    # -- chat pass-through ------------------------------------------------------------------------
    def sample_chat(self, name: str, body: bytes, package_arn: Optional[str]) -> Dict[str, Any]:
        """``SampleTrainingSession``: the body goes to the model as-is. The emulator's model
        container speaks the OpenAI chat-completions format (``{"messages": [...], "max_tokens",
        "temperature", "top_p", "stop", "seed"}`` in, a ``chat.completion`` out)."""
        session = self.state.session(name, runtime=True)
        session.require_runtime(self.state.options.strict)
        shape = "The request body must be a JSON object with a 'messages' list (OpenAI chat-completions format)"
        try:
            request = load_json(body)
        except BadRequestBody as err:
            raise validation(f"{shape}: {err}") from None
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise validation(shape)
        opts = self.state.options
        max_tokens = request.get("max_tokens")
        if max_tokens is None:
            max_tokens = request.get("max_completion_tokens")
        max_tokens = _integer(max_tokens, "max_tokens", 1, opts.max_chat_tokens, optional=True) or 256
        n = _integer(request.get("n"), "n", 1, opts.max_num_samples, optional=True) or 1
        seed = _integer(request.get("seed"), "seed", 0, MAX_SEED, optional=True)
        sampler = self._sampler(session, package_arn)
        tokenizer = sampler.get_tokenizer()
        try:
            prompt = prompt_tokens(tokenizer, messages)  # message text never becomes control tokens
            params = SamplingParams(
                max_tokens=max_tokens, temperature=request.get("temperature"), top_p=request.get("top_p"),
                seed=seed, stop=request.get("stop"),
            )
            future = sampler.sample(list(prompt), n, params)
        except (RlkitError, ValueError, TypeError, KeyError, AttributeError) as exc:  # the client's messages or options
            raise validation(_error_text(exc)) from None
        self.state.track_sampling(session, f"chat-{id(future)}", None, future)
        try:
            result = future.result()
        except concurrent.futures.CancelledError:
            raise ServiceError("ConflictException", f"Training session {name} ended ({session.status}) while this request was sampling") from None
        except (RlkitError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise validation(_error_text(exc)) from None
        with session.lock:
            session.billing["prefill"] += result.usage.prefill_tokens
            session.billing["sample"] += result.usage.decode_tokens
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": tokenizer.decode(s.tokens, skip_special_tokens=True)},
                "finish_reason": s.stop_reason.value,
            }
            for i, s in enumerate(result.sequences)
        ]
        return {
            "object": "chat.completion",
            "model": session.hub.get("name", session.local_model),
            "choices": choices,
            "usage": {
                "prompt_tokens": result.usage.prefill_tokens,
                "completion_tokens": result.usage.decode_tokens,
                "total_tokens": result.usage.prefill_tokens + result.usage.decode_tokens,
            },
        }
