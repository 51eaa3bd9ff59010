"""The server's operations: each ``/api/v1`` request, executed on the local engine.

Training operations (``forward_backward``, ``optim_step``, ``save_weights``,
``save_weights_for_sampler``, ``load_weights``) are accepted whenever their training run exists:
what the engine refuses (an unsupported loss, an image chunk, a wrong-length input) fails the
*future*, in order, so the run's ``seq_id`` sequence never has a gap that would block the
operations behind it. Sampling and creation requests that are malformed are refused at once (400).

Tinker's losses, as the server computes them (sums over tokens; r = p/q; A = ``advantages``;
lo/hi = ``clip_low_threshold``/``clip_high_threshold``, default 0.8/1.2):
``cross_entropy`` ``-sum w log p`` (w = ``weights``, 1 if absent); ``importance_sampling``
``-sum r A``; ``ppo`` ``-sum min(r A, clip(r, lo, hi) A)``; ``cispo``
``-sum sg[clip(r, lo, hi)] A log p``. Tinker's RL losses take no ``weights`` (a datum that has
them is weighted too; without them a token with A = 0, which adds nothing to these losses, is
left out of the diagnostics such as ``ppo/ratio:mean``). ``dro``, ``gspo``, ``stable_reinforce``
and ``custom`` are refused.
"""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from rlkit.backends.tinker.server import checks, wire
from rlkit.backends.tinker.server.runs import Run
from rlkit.backends.tinker.server.state import (
    Checkpoint,
    Future,
    Sampler,
    ServerState,
    TinkerError,
    bad_request,
    digest,
    not_found,
)
from rlkit.errors import InvalidInputError
from rlkit.losses.builtin import BUILTIN_LOSSES, builtin_loss
from rlkit.types import AdamParams, Datum, TensorData

log = logging.getLogger("rlkit.tinker.server")

#: the server computes exactly rlkit's built-ins (:mod:`rlkit.losses.builtin`); Tinker's others are refused
SUPPORTED_LOSSES = tuple(BUILTIN_LOSSES)
REFUSED_LOSSES = {
    "dro": "DRO",
    "gspo": "GSPO (Tinker's sequence-ratio variant)",
    "stable_reinforce": "StableReinforce (it needs the service's recorded stability information)",
    "custom": "server-side custom losses",
}
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# -- base models ------------------------------------------------------------------------------------


def model_table(extra: Dict[str, str]) -> Dict[str, str]:
    """Base-model name -> local model (``tiny``, ``smollm2-135m-instruct`` or a directory)."""
    table = {
        "tiny": "tiny",
        "rlkit/tiny": "tiny",
        "smollm2-135m-instruct": "smollm2-135m-instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct",
    }
    table.update(extra)
    return table


def tokenizer_dir(local_model: str) -> str:
    """A directory ``AutoTokenizer.from_pretrained`` loads the model's tokenizer from, offline."""
    from rlkit.backends.local import models

    if local_model == "tiny":
        return str(models.TINY_TOKENIZER_DIR)
    if local_model == models.DEFAULT_MODEL:
        return str(models._smollm2_cached_dir())
    return local_model


def resolve_model(state: ServerState, name: str) -> str:
    table = model_table(state.options.models)
    if name in table:
        return table[name]
    if Path(name) == Path(tokenizer_dir("tiny")):  # the tokenizer directory get_info hands out names it too
        return "tiny"
    # a directory only if the server was started with it (--model NAME=DIR): a client cannot make
    # the server load, or probe for, any other path on this machine
    served = {str(Path(v).resolve()): v for v in state.options.models.values()}
    resolved = str(Path(name).resolve()) if len(name) < 4096 and "\0" not in name else ""
    if resolved in served:
        return served[resolved]
    shown = name if len(name) <= 80 else name[:77] + "..."
    raise bad_request(
        f"base model {shown!r} is not served here; available: {', '.join(sorted(table))} "
        "(serve a local model directory with --model NAME=DIR)"
    )


# -- sessions, runs ----------------------------------------------------------------------------------


def _lora_kwargs(lora: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "seed": checks.seed(lora.get("seed"), "create_model.lora_config.seed"),
        "train_mlp": checks.boolean(lora.get("train_mlp"), "create_model.lora_config.train_mlp", default=True),
        "train_attn": checks.boolean(lora.get("train_attn"), "create_model.lora_config.train_attn", default=True),
    }


def create_model(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    session = state.live_session(checks.text(checks.field(body, "session_id", "create_model"), "create_model.session_id"))
    seq = checks.integer(checks.field(body, "model_seq_id", "create_model"), "create_model.model_seq_id", 0)
    lora = checks.obj(body, "lora_config", "create_model")
    rank = checks.integer(lora.get("rank", 32), "create_model.lora_config.rank", 1, 1024)
    lora_kwargs = _lora_kwargs(lora)
    for key in ("train_unembed",):
        checks.boolean(lora.get(key), f"create_model.lora_config.{key}", default=False)
    metadata = checks.metadata(body.get("user_metadata"), "create_model", state.options.max_metadata_bytes)
    base_model = checks.text(checks.field(body, "base_model", "create_model"), "create_model.base_model")
    local_model = resolve_model(state, base_model)
    optimizer = checks.obj(body, "optimizer_config", "create_model").get("type", "adamw")
    if optimizer != "adamw":
        raise bad_request(f"optimizer {checks._show(optimizer)} is not supported; rlkit's engine runs AdamW")
    if not (lora_kwargs["train_mlp"] or lora_kwargs["train_attn"]):
        raise bad_request(
            "train_mlp and train_attn are both false: the local engine puts no adapter on the unembedding"
        )
    model_id = f"{session.id}:train:{seq}"

    def start(future: Future) -> None:
        try:
            trainer = state.local.create_lora_training_client(
                local_model,
                rank=rank,
                alpha=state.options.lora_alpha,
                training_session_name=_local_name(model_id),
                **lora_kwargs,
            )
            state.add_run(
                Run(state, model_id, session.id, base_model, local_model, trainer, rank, lora, metadata, owner=session.owner)
            )
        except BaseException as exc:  # noqa: BLE001 - the creation future fails, whatever was raised
            future.finish(error=f"create_model: {wire_error(exc)}")
            return
        future.finish({"model_id": model_id, "type": "create_model"})

    return {"request_id": state.once(session.id, "model", seq, start, body), "model_id": model_id}


def _seq(body: Dict[str, Any], where: str) -> int:
    return checks.integer(checks.field(body, "seq_id", where), f"{where}.seq_id", 0)


def _local_name(model_id: str) -> str:
    return model_id.replace(":", "-")


def wire_error(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:2000]


def get_info(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    run = state.run(body["model_id"])
    return {
        "type": "get_info",
        "model_id": run.model_id,
        "model_data": {"arch": "llama", "model_name": run.base_model, "tokenizer_id": tokenizer_dir(run.local_model)},
        "is_lora": True,
        "lora_rank": run.rank,
        "model_name": run.base_model,
    }


# -- training operations ----------------------------------------------------------------------------


def tinker_loss(loss_fn: str, config: Dict[str, Any], data: List[Datum]):
    """rlkit's loss object for Tinker's ``loss_fn`` and the data to run it on (weights = 1 where
    Tinker's loss takes none)."""
    if loss_fn in REFUSED_LOSSES:
        raise InvalidInputError(
            f"loss_fn {loss_fn!r} ({REFUSED_LOSSES[loss_fn]}) is not supported by rlkit's Tinker server; "
            f"supported: {', '.join(SUPPORTED_LOSSES)}"
        )
    if loss_fn not in SUPPORTED_LOSSES:
        raise InvalidInputError(f"unknown loss_fn {loss_fn!r}; supported: {', '.join(SUPPORTED_LOSSES)}")
    if any(isinstance(v, str) for v in config.values()):
        raise InvalidInputError(f"{loss_fn}: text loss_fn_config values are not supported")
    loss = builtin_loss(loss_fn, config)
    out = []
    for datum in data:
        inputs = dict(datum.loss_fn_inputs)
        if "weights" not in inputs:
            if loss_fn == "cross_entropy":
                weights = [1.0] * datum.model_input.length
            else:  # a zero-advantage token adds nothing to an RL loss: leave it out of the diagnostics too
                advantages = inputs["advantages"].data if "advantages" in inputs else []
                weights = [1.0 if a != 0 else 0.0 for a in advantages] or [1.0] * datum.model_input.length
            inputs["weights"] = TensorData(data=weights)
        out.append(Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
    return loss, out


def forward_backward(state: ServerState, body: bytes) -> Dict[str, Any]:
    req = wire.forward_backward_request(body)
    run = state.run(req["model_id"])
    if req["n_data"] == 0:
        raise bad_request("forward_backward: no data")
    if req["seq_id"] < 0:
        raise bad_request(f"forward_backward: seq_id={req['seq_id']} must be >= 0")

    def op() -> bytes:
        loss, data = tinker_loss(req["loss_fn"], req["config"], req["datums"]())
        call = run.trainer.forward if req["forward_only"] else run.trainer.forward_backward
        return wire.forward_backward_output(call(data, loss).result())

    return {"request_id": run.submit(req["seq_id"], op, body), "model_id": run.model_id}


def adam_params(raw: Dict[str, Any]) -> AdamParams:
    """Tinker's ``AdamParams`` as rlkit's (its own defaults: beta2 0.95, eps 1e-12, no weight
    decay; ``grad_clip_norm`` 0 = no clipping; Tinker has no LoRA+)."""
    if not isinstance(raw, dict):
        raise bad_request(f"optim_step.adam_params: expected an object, got {checks._show(raw)}")

    def num(key: str, default: float) -> float:
        value = raw.get(key)
        return default if value is None else checks.number(value, f"optim_step.adam_params.{key}")

    clip = num("grad_clip_norm", 0.0)
    return AdamParams(
        learning_rate=num("learning_rate", 1e-4),
        beta1=num("beta1", 0.9),
        beta2=num("beta2", 0.95),
        eps=num("eps", 1e-12),
        weight_decay=num("weight_decay", 0.0),
        grad_clip_norm=clip if clip > 0 else None,
    )


def optim_step(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    run = state.run(body["model_id"])
    raw = body.get("adam_params")
    if raw is None:
        kind = (body.get("optimizer_params") or {}).get("type")
        raise bad_request(
            f"optim_step: optimizer {kind!r} is not supported; rlkit's engine runs AdamW (send AdamParams)"
        )

    seq = _seq(body, "optim_step")
    params = run.checked(seq, body, lambda: adam_params(raw))  # a 400 at submit; its seq_id still passes in order

    def op() -> Dict[str, Any]:
        out = run.trainer.optim_step(params).result()
        return {"metrics": {k: float(v) for k, v in out.metrics.items()}}

    return {"request_id": run.submit(seq, op, body), "model_id": run.model_id}


def _checkpoint_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME_OK.match(name):
        raise InvalidInputError(f"{where}: checkpoint name {name!r} must be 1-128 letters, digits, '.', '_' or '-'")
    return name


def _metadata(state: ServerState, run: Run, body: Dict[str, Any], where: str) -> Optional[Dict[str, Any]]:
    limit = state.options.max_metadata_bytes
    return run.checked(_seq(body, where), body, lambda: checks.metadata(body.get("user_metadata"), where, limit))


def save_weights(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    run = state.run(body["model_id"])
    metadata = _metadata(state, run, body, "save_state")
    overwrite = run.checked(_seq(body, "save_state"), body, lambda: checks.boolean(body.get("overwrite"), "save_state.overwrite", False))

    def op() -> Dict[str, Any]:
        name = _checkpoint_name(body.get("path"), "save_state")
        path = f"tinker://{run.model_id}/weights/{name}"
        local = (
            run.trainer.save_state(name, name=f"state-{name}", overwrite=overwrite)
            .result()
            .model_package_arn
        )
        state.add_checkpoint(
            Checkpoint(path, local, "training", run.model_id, name, run.base_model, _now(), metadata, run.owner)
        )
        return {"path": path, "type": "save_weights"}

    return {"request_id": run.submit(_seq(body, "training operation"), op, body), "model_id": run.model_id}


def save_weights_for_sampler(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    run = state.run(body["model_id"])
    metadata = _metadata(state, run, body, "save_weights_for_sampler")

    def kind() -> None:
        if body.get("kind", "snapshot") != "snapshot":
            raise bad_request(f"save_weights_for_sampler: kind={checks._show(body.get('kind'))} is not supported (snapshot only)")

    run.checked(_seq(body, "save_weights_for_sampler"), body, kind)

    def op() -> Dict[str, Any]:
        if body.get("path") is None:  # save_weights_and_get_sampling_client: in-memory weights
            client = run.trainer.save_weights_and_get_sampling_client()
            sampler = Sampler(
                id=f"{run.session_id}:sample:{body.get('sampling_session_seq_id', uuid.uuid4().hex)}",
                base_model=run.base_model,
                model_path=None,
                client=client,
                owner=run.owner,
            )
            state.add_sampler(run.session_id, sampler)
            run.keep_sampler(sampler.id)
            return {"sampling_session_id": sampler.id, "type": "save_weights_for_sampler"}
        name = _checkpoint_name(body["path"], "save_weights_for_sampler")
        path = f"tinker://{run.model_id}/sampler_weights/{name}"
        local = run.trainer.save_weights_for_sampler(name, name=f"sampler-{name}").result().model_package_arn
        state.add_checkpoint(
            Checkpoint(path, local, "sampler", run.model_id, name, run.base_model, _now(), metadata, run.owner)
        )
        return {"path": path, "type": "save_weights_for_sampler"}

    return {"request_id": run.submit(_seq(body, "training operation"), op, body), "model_id": run.model_id}


def _now() -> float:
    import time

    return time.time()


def load_weights(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    def flag() -> bool:
        return checks.boolean(body.get("optimizer"), "load_weights.optimizer", False)

    if body.get("session_id") is not None:  # create-via-load: a new training run from the checkpoint
        return _create_from_checkpoint(state, body, flag())
    run = state.run(body["model_id"])
    with_optimizer = run.checked(_seq(body, "load_weights"), body, flag)

    def op() -> Dict[str, Any]:
        ckpt = state.checkpoint(body["path"], owner=run.owner)  # on the run's thread: the run's owner decides
        if with_optimizer and ckpt.kind != "training":
            raise InvalidInputError(
                f"{ckpt.tinker_path} holds sampler weights only; loading the optimizer needs a save_state checkpoint"
            )
        (run.trainer.load_state_with_optimizer if with_optimizer else run.trainer.load_state)(ckpt.local_id).result()
        return {"path": ckpt.tinker_path, "model_id": run.model_id, "type": "load_weights"}

    return {"request_id": run.submit(_seq(body, "training operation"), op, body), "model_id": run.model_id}


def _create_from_checkpoint(state: ServerState, body: Dict[str, Any], with_optimizer: bool) -> Dict[str, Any]:
    session = state.live_session(checks.text(body["session_id"], "load_weights.session_id"))
    seq = checks.integer(checks.field(body, "model_seq_id", "load_weights"), "load_weights.model_seq_id", 0)
    metadata = checks.metadata(body.get("user_metadata"), "load_weights", state.options.max_metadata_bytes)
    ckpt = state.checkpoint(checks.text(body.get("path"), "load_weights.path"))
    label = checks.text(body.get("base_model"), "load_weights.base_model", optional=True)
    if with_optimizer and ckpt.kind != "training":
        raise bad_request(
            f"{ckpt.tinker_path} holds sampler weights only; restoring the optimizer needs a save_state checkpoint"
        )
    model_id = f"{session.id}:train:{seq}"

    def start(future: Future) -> None:
        from rlkit.backends.local import checkpoints as ckpts

        try:
            meta = ckpts.read_meta(ckpt.local_id)
            create = (
                state.local.create_training_client_from_state_with_optimizer
                if with_optimizer
                else state.local.create_training_client_from_state
            )
            trainer = create(ckpt.local_id, training_session_name=_local_name(model_id))
            lora = {
                "rank": meta["rank"],
                "train_mlp": meta.get("train_mlp", True),
                "train_attn": meta.get("train_attn", True),
            }
            base_model = label or ckpt.base_model
            state.add_run(
                Run(
                    state,
                    model_id,
                    session.id,
                    base_model,
                    meta["base_model"],
                    trainer,
                    int(meta["rank"]),
                    lora,
                    metadata,
                    owner=session.owner,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - every future resolves
            future.finish(error=f"load_weights: {wire_error(exc)}")
            return
        future.finish({"path": ckpt.tinker_path, "model_id": model_id, "type": "load_weights"})

    return {"request_id": state.once(session.id, "model", seq, start, body), "model_id": model_id}


# -- sampling ---------------------------------------------------------------------------------------


def _local_sampler(state: ServerState, base_model: Optional[str], model_path: Optional[str]):
    if model_path:
        ckpt = state.checkpoint(model_path)
        return ckpt.base_model, state.local.create_sampling_client(model_package_arn=ckpt.local_id)
    if not base_model:
        raise bad_request("a sampler needs base_model or model_path")
    return base_model, state.local.create_sampling_client(base_model=resolve_model(state, base_model))


def create_sampling_session(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    where = "create_sampling_session"
    session = state.live_session(checks.text(checks.field(body, "session_id", where), f"{where}.session_id"))
    seq = checks.integer(checks.field(body, "sampling_session_seq_id", where), f"{where}.sampling_session_seq_id", 0)
    base_model = checks.text(body.get("base_model"), f"{where}.base_model", optional=True)
    model_path = checks.text(body.get("model_path"), f"{where}.model_path", optional=True)
    sampler_id = f"{session.id}:sample:{seq}"
    with state.lock:
        known = state.samplers.get(sampler_id)
    if known is not None:
        if (known.base_model if not model_path else known.model_path) != (base_model if not model_path else model_path):
            raise TinkerError(409, f"sampling_session_seq_id {seq} of session {session.id} was already used for another sampler")
    else:
        base_model, client = _local_sampler(state, base_model, model_path)
        state.add_sampler(session.id, Sampler(sampler_id, base_model, model_path, client, owner=session.owner))
    return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}


def get_sampler(state: ServerState, sampler_id: str) -> Dict[str, Any]:
    s = state.sampler(sampler_id)
    return {"sampler_id": s.id, "base_model": s.base_model, "model_path": s.model_path}


_UNSUPPORTED_SAMPLE = {
    "topk_sample_logprobs": "top-k logprobs of sampled tokens",
    "target_prompt_logprobs": "target_prompt_logprobs",
    "prompt_alt_tokens_k": "prompt_alt_tokens_k",
    "record_stability_info": "record_stability_info (StableReinforce)",
}


def _sample_request(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    """Every field of an ``asample`` body checked (types, ranges), before a sampler is touched."""
    for key, what in _UNSUPPORTED_SAMPLE.items():
        if body.get(key):
            raise bad_request(f"asample: {what} is not supported by rlkit's Tinker server")
    cap = state.options.max_num_samples
    raw_params = checks.obj(body, "sampling_params", "asample")
    params, stop_ids = wire.sampling_params(raw_params, "asample.sampling_params", state.options.default_max_tokens)
    return {
        "num_samples": checks.integer(body.get("num_samples", 1), "asample.num_samples", 1, cap),
        "tokens": wire.json_model_input(checks.field(body, "prompt", "asample"), "asample.prompt"),
        "params": params,
        "stop_ids": stop_ids,
        "max_tokens_given": raw_params.get("max_tokens") is not None,
        "prompt_logprobs": checks.boolean(body.get("prompt_logprobs"), "asample.prompt_logprobs", False),
        "last_n": checks.optional_integer(body.get("prompt_logprobs_last_n"), "asample.prompt_logprobs_last_n", 0),
        "topk": checks.integer(body.get("topk_prompt_logprobs") or 0, "asample.topk_prompt_logprobs", 0) or None,
        "seq": checks.optional_integer(body.get("seq_id"), "asample.seq_id", 0),
        "session": checks.text(body.get("sampling_session_id"), "asample.sampling_session_id", optional=True),
        "base_model": checks.text(body.get("base_model"), "asample.base_model", optional=True),
        "model_path": checks.text(body.get("model_path"), "asample.model_path", optional=True),
    }


def _fit(req: Dict[str, Any], client: Any) -> None:
    """The checks that need the model: top-k against the vocabulary, lengths against the context."""
    runtime = getattr(client, "_runtime", None)
    vocab = getattr(getattr(getattr(runtime, "sampler", None), "sampler", None), "vocab_size", None)
    window = client.context_window
    if vocab is not None and req["topk"] is not None and req["topk"] > vocab:
        raise bad_request(f"asample.topk_prompt_logprobs={req['topk']} is more than the vocabulary ({vocab} tokens)")
    if req["max_tokens_given"] and req["params"].max_tokens > window:
        raise bad_request(f"asample.sampling_params.max_tokens={req['params'].max_tokens} is more than the model's context window ({window})")


def asample(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    req = _sample_request(state, body)
    tokens, num_samples, last_n, seq = req["tokens"], req["num_samples"], req["last_n"], req["seq"]
    if req["session"]:
        sampler = state.sampler(req["session"])
        if not state.session_is_live(sampler.id.split(":", 1)[0]):
            raise TinkerError(410, f"sampling session {sampler.id} belongs to a session that has finished")
    else:
        base_model, client = _local_sampler(state, req["base_model"], req["model_path"])
        sampler = Sampler(f"direct:{uuid.uuid4().hex}", base_model, req["model_path"], client, owner=state.caller())
    key = digest(body)
    with sampler.lock:
        if seq is not None and seq in sampler.seen:
            rid, first = sampler.seen[seq]
            if first != key:
                raise TinkerError(409, f"seq_id {seq} of sampling session {sampler.id} was already used for a different request")
            state.stats["duplicate_submits"] += 1
            return {"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(num_samples)]}
        if sampler.client is None:
            raise bad_request(
                f"sampling session {sampler.id} was released (a run keeps its newest in-memory samplers only, "
                "and a finished session releases all of them)"
            )
        _fit(req, sampler.client)
        local = sampler.client.sample(
            tokens,
            num_samples,
            req["params"],
            include_prompt_logprobs=req["prompt_logprobs"],
            topk_prompt_logprobs=req["topk"],
            stop_token_ids=req["stop_ids"],
        )
        future = state.new_future(owner=sampler.owner)
        if seq is not None:
            sampler.seen[seq] = (future.request_id, key)
        # registered before the callback below can run: a finished sample always leaves InFlight
        state.inflight.add(future, local, sampler.id, sampler.owner, state.options.request_deadline_s)
    state.stats["samples_started"] += 1

    def done(f: Any) -> None:
        state.inflight.done(future.request_id)
        try:
            if f.cancelled() or f.cancel_requested:  # the canceller already failed the future, naming why
                future.finish(error="sample: cancelled", category="user")
                return
            exc = f.exception()
            if exc is not None:
                category = "user" if isinstance(exc, InvalidInputError) else "server"
                future.finish(error=f"sample: {wire_error(exc)}", category=category)
            else:
                future.finish(wire.sample_response(f.result(), len(tokens), last_n))
        except BaseException as err:  # noqa: BLE001 - every future resolves, even if building its answer fails
            log.exception("sample result for %s could not be built", future.request_id)
            future.finish(error=f"sample: {type(err).__name__}: {wire_error(err)}", category="server")

    local.add_done_callback(done)
    rid = future.request_id
    return {"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(num_samples)]}


# -- REST: runs and checkpoints ---------------------------------------------------------------------


def parse_path(tinker_path: str) -> Dict[str, str]:
    m = re.fullmatch(r"tinker://([^/]+)/(weights|sampler_weights)/([^/]+)", tinker_path or "")
    if not m:
        raise bad_request(
            f"{tinker_path!r} is not a tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME path"
        )
    return {"run": m.group(1), "segment": m.group(2), "name": m.group(3)}


def training_run(state: ServerState, model_id: str) -> Dict[str, Any]:
    with state.lock:
        run = state.runs.get(model_id)
    if run is not None and state.visible(run.owner):
        return run.wire()
    ckpts = state.checkpoints_of(model_id)
    if not ckpts:
        raise not_found(f"no training run {model_id!r}")
    meta = _meta(ckpts[-1])
    return {
        "training_run_id": model_id,
        "base_model": ckpts[-1].base_model,
        "model_owner": "local",
        "is_lora": True,
        "lora_rank": meta.get("rank"),
        "last_request_time": ckpts[-1].wire()["time"],
        "last_checkpoint": next((c.wire() for c in reversed(ckpts) if c.kind == "training"), None),
        "last_sampler_checkpoint": next((c.wire() for c in reversed(ckpts) if c.kind == "sampler"), None),
    }


def _meta(ckpt: Checkpoint) -> Dict[str, Any]:
    from rlkit.backends.local import checkpoints as ckpts

    return ckpts.read_meta(ckpt.local_id)


def weights_info(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    ckpt = state.checkpoint(body["tinker_path"])
    meta = _meta(ckpt)
    return {
        "base_model": ckpt.base_model,
        "is_lora": True,
        "lora_rank": meta["rank"],
        "train_unembed": False,
        "train_mlp": meta.get("train_mlp", True),
        "train_attn": meta.get("train_attn", True),
    }
