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

from rlkit.backends.tinker.server import wire
from rlkit.backends.tinker.server.state import Checkpoint, Future, Run, Sampler, ServerState, bad_request, not_found
from rlkit.errors import InvalidInputError
from rlkit.types import AdamParams, Datum, TensorData

log = logging.getLogger("rlkit.tinker.server")

SUPPORTED_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
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
    if Path(name).is_dir():
        return str(Path(name).resolve())
    raise bad_request(
        f"base model {name!r} is not served here; available: {', '.join(sorted(table))} or a local model directory"
    )


# -- sessions, runs ----------------------------------------------------------------------------------


def _lora_kwargs(lora: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "seed": lora.get("seed"),
        "train_mlp": bool(lora.get("train_mlp", True)),
        "train_attn": bool(lora.get("train_attn", True)),
    }


def create_model(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    session = state.session(body["session_id"])
    seq = int(body["model_seq_id"])
    lora = body.get("lora_config") or {}
    rank = int(lora.get("rank", 32))
    base_model = str(body["base_model"])
    local_model = resolve_model(state, base_model)
    optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
    if optimizer != "adamw":
        raise bad_request(f"optimizer {optimizer!r} is not supported; rlkit's engine runs AdamW")
    if not (lora.get("train_mlp", True) or lora.get("train_attn", True)):
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
                **_lora_kwargs(lora),
            )
            state.add_run(
                Run(
                    state, model_id, session.id, base_model, local_model, trainer, rank, lora, body.get("user_metadata")
                )
            )
        except Exception as exc:  # noqa: BLE001 - the creation future fails
            future.finish(error=f"create_model: {wire_error(exc)}")
            return
        future.finish({"model_id": model_id, "type": "create_model"})

    return {"request_id": state.once(session.id, "model", seq, start), "model_id": model_id}


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
    from rlkit.losses.builtin import builtin_loss

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

    def op() -> bytes:
        loss, data = tinker_loss(req["loss_fn"], req["config"], req["datums"]())
        call = run.trainer.forward if req["forward_only"] else run.trainer.forward_backward
        return wire.forward_backward_output(call(data, loss).result())

    return {"request_id": run.submit(req["seq_id"], op), "model_id": run.model_id}


def adam_params(raw: Dict[str, Any]) -> AdamParams:
    """Tinker's ``AdamParams`` as rlkit's (its own defaults: beta2 0.95, eps 1e-12, no weight
    decay; ``grad_clip_norm`` 0 = no clipping; Tinker has no LoRA+)."""
    clip = float(raw.get("grad_clip_norm", 0.0) or 0.0)
    return AdamParams(
        learning_rate=float(raw.get("learning_rate", 1e-4)),
        beta1=float(raw.get("beta1", 0.9)),
        beta2=float(raw.get("beta2", 0.95)),
        eps=float(raw.get("eps", 1e-12)),
        weight_decay=float(raw.get("weight_decay", 0.0)),
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

    def op() -> Dict[str, Any]:
        out = run.trainer.optim_step(adam_params(raw)).result()
        return {"metrics": {k: float(v) for k, v in out.metrics.items()}}

    return {"request_id": run.submit(int(body["seq_id"]), op), "model_id": run.model_id}


def _checkpoint_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME_OK.match(name):
        raise InvalidInputError(f"{where}: checkpoint name {name!r} must be 1-128 letters, digits, '.', '_' or '-'")
    return name


def save_weights(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    run = state.run(body["model_id"])

    def op() -> Dict[str, Any]:
        name = _checkpoint_name(body.get("path"), "save_state")
        path = f"tinker://{run.model_id}/weights/{name}"
        local = (
            run.trainer.save_state(name, name=f"state-{name}", overwrite=bool(body.get("overwrite")))
            .result()
            .model_package_arn
        )
        state.add_checkpoint(
            Checkpoint(path, local, "training", run.model_id, name, run.base_model, _now(), body.get("user_metadata"))
        )
        return {"path": path, "type": "save_weights"}

    return {"request_id": run.submit(int(body["seq_id"]), op), "model_id": run.model_id}


def save_weights_for_sampler(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    run = state.run(body["model_id"])
    if body.get("kind", "snapshot") != "snapshot":
        raise bad_request(f"save_weights_for_sampler: kind={body.get('kind')!r} is not supported (snapshot only)")

    def op() -> Dict[str, Any]:
        if body.get("path") is None:  # save_weights_and_get_sampling_client: in-memory weights
            client = run.trainer.save_weights_and_get_sampling_client()
            sampler = Sampler(
                id=f"{run.session_id}:sample:{body.get('sampling_session_seq_id', uuid.uuid4().hex)}",
                base_model=run.base_model,
                model_path=None,
                client=client,
            )
            state.add_sampler(run.session_id, sampler)
            run.keep_sampler(sampler.id)
            return {"sampling_session_id": sampler.id, "type": "save_weights_for_sampler"}
        name = _checkpoint_name(body["path"], "save_weights_for_sampler")
        path = f"tinker://{run.model_id}/sampler_weights/{name}"
        local = run.trainer.save_weights_for_sampler(name, name=f"sampler-{name}").result().model_package_arn
        state.add_checkpoint(
            Checkpoint(path, local, "sampler", run.model_id, name, run.base_model, _now(), body.get("user_metadata"))
        )
        return {"path": path, "type": "save_weights_for_sampler"}

    return {"request_id": run.submit(int(body["seq_id"]), op), "model_id": run.model_id}


def _now() -> float:
    import time

    return time.time()


def load_weights(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    with_optimizer = bool(body.get("optimizer"))
    if body.get("session_id") is not None:  # create-via-load: a new training run from the checkpoint
        return _create_from_checkpoint(state, body, with_optimizer)
    run = state.run(body["model_id"])

    def op() -> Dict[str, Any]:
        ckpt = state.checkpoint(body["path"])
        if with_optimizer and ckpt.kind != "training":
            raise InvalidInputError(
                f"{ckpt.tinker_path} holds sampler weights only; loading the optimizer needs a save_state checkpoint"
            )
        (run.trainer.load_state_with_optimizer if with_optimizer else run.trainer.load_state)(ckpt.local_id).result()
        return {"path": ckpt.tinker_path, "model_id": run.model_id, "type": "load_weights"}

    return {"request_id": run.submit(int(body["seq_id"]), op), "model_id": run.model_id}


def _create_from_checkpoint(state: ServerState, body: Dict[str, Any], with_optimizer: bool) -> Dict[str, Any]:
    session = state.session(body["session_id"])
    seq = int(body["model_seq_id"])
    ckpt = state.checkpoint(body["path"])
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
            base_model = body.get("base_model") or ckpt.base_model
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
                    body.get("user_metadata"),
                )
            )
        except Exception as exc:  # noqa: BLE001
            future.finish(error=f"load_weights: {wire_error(exc)}")
            return
        future.finish({"path": ckpt.tinker_path, "model_id": model_id, "type": "load_weights"})

    return {"request_id": state.once(session.id, "model", seq, start), "model_id": model_id}


# -- sampling ---------------------------------------------------------------------------------------


def _local_sampler(state: ServerState, base_model: Optional[str], model_path: Optional[str]):
    if model_path:
        ckpt = state.checkpoint(model_path)
        return ckpt.base_model, state.local.create_sampling_client(model_package_arn=ckpt.local_id)
    if not base_model:
        raise bad_request("a sampler needs base_model or model_path")
    return base_model, state.local.create_sampling_client(base_model=resolve_model(state, base_model))


def create_sampling_session(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    session = state.session(body["session_id"])
    seq = int(body["sampling_session_seq_id"])
    sampler_id = f"{session.id}:sample:{seq}"
    with state.lock:
        known = sampler_id in state.samplers
    if not known:
        base_model, client = _local_sampler(state, body.get("base_model"), body.get("model_path"))
        state.add_sampler(session.id, Sampler(sampler_id, base_model, body.get("model_path"), client))
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


def asample(state: ServerState, body: Dict[str, Any]) -> Dict[str, Any]:
    for key, what in _UNSUPPORTED_SAMPLE.items():
        if body.get(key):
            raise bad_request(f"asample: {what} is not supported by rlkit's Tinker server")
    num_samples = int(body.get("num_samples", 1))
    tokens = wire.json_model_input(body["prompt"], "asample.prompt")
    params, stop_ids = wire.sampling_params(body.get("sampling_params") or {}, "asample.sampling_params")
    last_n = body.get("prompt_logprobs_last_n")
    topk = int(body.get("topk_prompt_logprobs") or 0) or None
    if body.get("sampling_session_id"):
        sampler = state.sampler(body["sampling_session_id"])
    else:
        base_model, client = _local_sampler(state, body.get("base_model"), body.get("model_path"))
        sampler = Sampler(f"direct:{uuid.uuid4().hex}", base_model, body.get("model_path"), client)
    seq = body.get("seq_id")
    with sampler.lock:
        if seq is not None and int(seq) in sampler.seen:
            state.stats["duplicate_submits"] += 1
            rid = sampler.seen[int(seq)]
            return {"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(num_samples)]}
        if sampler.client is None:
            raise bad_request(
                f"sampling session {sampler.id} was released (a run keeps its newest in-memory samplers only)"
            )
        local = sampler.client.sample(
            tokens,
            num_samples,
            params,
            include_prompt_logprobs=bool(body.get("prompt_logprobs")),
            topk_prompt_logprobs=topk,
            stop_token_ids=stop_ids,
        )
        future = state.new_future()
        if seq is not None:
            sampler.seen[int(seq)] = future.request_id
    state.stats["samples_started"] += 1

    def done(f: Any) -> None:
        exc = f.exception()
        if exc is not None:
            future.finish(
                error=f"sample: {wire_error(exc)}", category="user" if isinstance(exc, InvalidInputError) else "server"
            )
        else:
            future.finish(wire.sample_response(f.result(), len(tokens), last_n))

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
    if run is not None:
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
