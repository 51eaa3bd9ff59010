"""The local backend's clients: the session API over :class:`TrainingEngine` and :class:`Sampler`.

Every argument is validated at the call site, before anything is queued, so a bad call raises an
:class:`~rlkit.errors.RlkitError` naming the datum/key/value and changes no state. Accepted work
returns an :class:`~rlkit.futures.APIFuture` at once.
"""

from __future__ import annotations

import itertools
import threading
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from rlkit.backends.local import checkpoints as ckpt
from rlkit.backends.local import dcp_state, distributed
from rlkit.backends.local.device import resolve_device
from rlkit.backends.local.engine import LoraSpec, TrainingEngine
from rlkit.backends.local.fusion import FusableOp, FusingWorker
from rlkit.backends.local.models import LoadedModel, canonical_name, load_model, share_base
from rlkit.backends.local.precision import check_precision, resolve_precision
from rlkit.backends.local.rank_memory import after_engine, sampler_for
from rlkit.backends.local.sampler import SampleRequest
from rlkit.backends.local.threadpools import release_idle_pool
from rlkit.backends.local.workers import OrderedWorker, SamplerWorker, make_job
from rlkit.errors import CheckpointCorruptError, CheckpointNotFoundError, InvalidInputError
from rlkit.futures import APIFuture
from rlkit.losses.base import Loss
from rlkit.engine.capabilities import Capabilities
from rlkit.engine.checks import LoraRequest
from rlkit.engine.clients import SamplingClientBase, TrainingClientBase
from rlkit.engine.service import ServiceClientBase
from rlkit.losses.builtin import BUILTIN_CLASSES, builtin_config_keys
from rlkit.types import (AdamParams, Datum, ForwardBackwardOutput, LoadStateResponse, OptimStepResponse,
    SampleResponse, SamplingParams, SaveStateResponse, SaveWeightsResponse)

_session_counter = itertools.count(1)
_ephemeral_counter = itertools.count(1)
EPHEMERAL = "local-memory://"  # ids of in-memory sampler weights (see save_weights_and_get_sampling_client)


@dataclass
class ModelRuntime:
    """What all clients of one base model share: the one frozen copy of its weights (each training
    session's model and the sampler are module trees over these same tensors), tokenizer, sampler worker,
    and with ``fuse_runs`` the one training thread of all its sessions (:mod:`.fusion`)."""

    loaded: LoadedModel
    sampler: SamplerWorker
    trainer: Optional[FusingWorker] = None

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer


class LocalSamplingClient(SamplingClientBase):
    """Samples from one fixed set of weights: the base model or a saved checkpoint (the contract's
    checks are :class:`rlkit.engine.clients.SamplingClientBase`'s; ``on_token`` and ``stop_token_ids``
    are this engine's own keywords, see :meth:`_sample`)."""

    extensions = frozenset({"on_token", "stop_token_ids"})

    def __init__(self, runtime: ModelRuntime, weights_key: str = ""):
        self._runtime = runtime
        self.weights_key = weights_key
        self._stopped = False
        if weights_key.startswith(EPHEMERAL):  # in-memory weights live as long as a client holds them
            runtime.sampler.retain(weights_key)
            weakref.finalize(self, runtime.sampler.release, weights_key)

    def get_tokenizer(self) -> Any:
        return self._runtime.tokenizer

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    @property
    def vocab_size(self) -> int:
        return self._runtime.sampler.sampler.vocab_size

    @property
    def max_positions(self) -> int:
        return self._runtime.sampler.sampler.max_positions

    @property
    def context_window(self) -> int:
        """The model's context length in tokens (prompt + completion)."""
        return self._runtime.sampler.sampler.max_positions

    def _sample(
        self,
        tokens: List[int],
        num_samples: int,
        params: SamplingParams,
        include_prompt_logprobs: bool,
        topk_prompt_logprobs: Optional[int],
        on_token: Optional[Callable[[int, int], None]] = None,
        stop_token_ids: Optional[Sequence[int]] = None,
    ) -> APIFuture[SampleResponse]:
        """Sample ``num_samples`` completions of ``tokens`` (checked by ``sample``).

        ``on_token`` (a local-backend extension, not in the SageMaker API): called on the sampler's
        thread with ``(sample_index, token_id)`` as each token is chosen, so a caller can stream
        tokens before the response is complete. It must return quickly (hand the token to a queue).

        ``stop_token_ids`` (a local-backend extension, Tinker's ``stop=[ids]``): the token ids that
        end a sample instead of the model's end-of-turn tokens; ``[]`` stops on none.
        """
        sampler = self._runtime.sampler.sampler
        if params.constraint is not None:  # a grammar that cannot compile is refused here, naming where
            from rlkit.constraints import check_constraint

            check_constraint(params.constraint, "sample: sampling_params.constraint")
        if on_token is not None and not callable(on_token):
            raise InvalidInputError(f"sample: on_token={on_token!r} must be callable")
        if stop_token_ids is not None:
            stop_token_ids = [int(t) for t in stop_token_ids]
            bad = [t for t in stop_token_ids if t < 0 or t >= sampler.vocab_size]
            if bad:
                raise InvalidInputError(f"sample: stop token id {bad[0]} is outside the vocabulary [0, {sampler.vocab_size})")
        request = SampleRequest(tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs, on_token=on_token,
                                stop_token_ids=stop_token_ids)
        return self._runtime.sampler.submit(make_job(self.weights_key, "sample", request, "sample"))

    def _compute_logprobs(self, tokens: List[int]) -> APIFuture[List[Optional[float]]]:
        return self._runtime.sampler.submit(make_job(self.weights_key, "logprobs", tokens, "compute_logprobs"))


def _apply_checkpoint(engine: TrainingEngine, checkpoint: str, tensors: Dict[str, torch.Tensor],
                      optimizer_state: Optional[Dict[str, Any]], step: int) -> None:
    """Put verified checkpoint contents into ``engine``, all or nothing: if a part does not fit (a
    tensor this adapter lacks or of another shape, an optimizer state for other parameters), the
    weights, optimizer state and step count are restored and :class:`CheckpointCorruptError` names
    the file. Gradients are cleared only once everything is in."""
    params = [p for _, p in engine.named_trainable]
    undo = _undo_point(engine, checkpoint)
    try:
        engine.load_weights(tensors)
    except Exception as exc:  # noqa: BLE001 - a shape mismatch (RuntimeError), unknown keys
        raise undo(ckpt.ADAPTER, exc) from None
    engine.optimizer.state.clear()
    if optimizer_state is not None:
        try:
            engine.optimizer.load_state_dict(optimizer_state)
            for p in params:
                for key, value in engine.optimizer.state.get(p, {}).items():
                    if torch.is_tensor(value) and value.dim() > 0 and value.shape != p.shape:
                        shapes = f"{tuple(value.shape)} for a parameter of shape {tuple(p.shape)}"
                        raise ValueError(f"state {key!r} has shape {shapes}")
        except Exception as exc:  # noqa: BLE001 - group sizes or shapes that do not match
            raise undo(ckpt.OPTIMIZER, exc) from None
        engine.steps = step
    engine.optimizer.zero_grad(set_to_none=True)
    engine.pending_grad_tokens = 0


def _undo_point(engine: TrainingEngine, checkpoint: str) -> Callable[[str, BaseException], CheckpointCorruptError]:
    """What restores ``engine``'s weights, optimizer state, step count and gradients as they are
    now, and returns the :class:`CheckpointCorruptError` naming the file that did not fit."""
    import copy

    params = [p for _, p in engine.named_trainable]
    weights = [p.detach().clone() for p in params]
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    optimizer, steps = copy.deepcopy(engine.optimizer.state_dict()), engine.steps

    def undo(name: str, exc: BaseException) -> CheckpointCorruptError:
        with torch.no_grad():
            for p, value, grad in zip(params, weights, grads):
                p.copy_(value)
                p.grad = grad
        engine.optimizer.state.clear()
        engine.optimizer.load_state_dict(optimizer)
        engine.steps = steps
        message = f"checkpoint {checkpoint}: {name} does not fit this session ({exc}); nothing was loaded"
        return CheckpointCorruptError(message, checkpoint=checkpoint, file=name)

    return undo


def _apply_sharded(engine: TrainingEngine, checkpoint: str, meta: Dict[str, Any], with_optimizer: bool) -> None:
    """Put a DCP checkpoint (saved on N ranks, :mod:`.dcp_state`) into ``engine`` on any number of
    ranks: every file verified first (a corrupt one changes nothing), then all or nothing as
    :func:`_apply_checkpoint`."""
    ckpt.verify_sharded(checkpoint, meta)
    undo = _undo_point(engine, checkpoint)
    try:
        dcp_state.load_into(engine, ckpt.resolve(checkpoint), with_optimizer)
    except Exception as exc:  # noqa: BLE001 - keys or shapes that do not match (DCP's CheckpointException)
        raise undo(dcp_state.DCP_METADATA, exc) from None
    if with_optimizer:
        engine.steps = int(meta.get("step", 0))
    engine.optimizer.zero_grad(set_to_none=True)
    engine.pending_grad_tokens = 0


class LocalTrainingClient(TrainingClientBase):
    """A LoRA training session on the local engine: the primitives of
    :class:`rlkit.engine.clients.TrainingClientBase` (which owns every check and the routing of a loss)
    over :class:`TrainingEngine`, run in submission order on one worker thread (with ``fuse_runs``,
    on the base model's :class:`~.fusion.FusingWorker`, one lane per session)."""

    def __init__(self, service: "LocalServiceClient", runtime: ModelRuntime, engine: TrainingEngine, name: str, base_model: str):
        super().__init__(name, base_model)
        self._service = service
        self._runtime = runtime
        self._engine = engine
        self._worker = runtime.trainer.lane(name, engine) if runtime.trainer is not None else OrderedWorker(f"rlkit-train-{name}")
        self.checkpoint_root = service.checkpoint_dir / name

    def get_tokenizer(self) -> Any:
        return self._runtime.tokenizer

    def _submit(self, fn, operation: str, fuse: Optional[FusableOp] = None) -> APIFuture:
        """Queue ``fn`` in submission order; ``fuse``: it may run in a pass with other sessions'
        (only on a fusing worker, ``fuse_runs=True``)."""
        with self._lock:
            self._check()
            if fuse is not None and self._runtime.trainer is not None:
                return self._worker.submit(fn, operation=operation, fuse=fuse)
            return self._worker.submit(fn, operation=operation)

    @staticmethod
    def _fusable(loss: Loss, data: List[Datum], backward: bool) -> Optional[FusableOp]:
        """A built-in (by name or its class's instance), datum-separable loss may share a pass with
        other runs' (:mod:`.fusion`); a custom loss runs in passes of its own."""
        return FusableOp(backward, list(data), loss) if type(loss) in BUILTIN_CLASSES and loss.datum_separable else None

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    @property
    def max_positions(self) -> int:
        return self._engine.max_positions

    # -- training ---------------------------------------------------------------------------------
    def _forward_backward(self, data: List[Datum], loss: Loss) -> APIFuture[ForwardBackwardOutput]:
        """Forward + backward of the call's validated loss, a built-in or any Loss object (this
        engine differentiates it); a failed pass leaves the accumulated gradient as it was."""
        engine = self._engine

        def run() -> ForwardBackwardOutput:
            saved = [None if p.grad is None else p.grad.clone() for _, p in engine.named_trainable]
            tokens_before = engine.pending_grad_tokens
            try:
                return engine.run(data, loss, backward=True)
            except BaseException:
                for (_, p), g in zip(engine.named_trainable, saved):  # leave the session as it was
                    p.grad = g
                engine.pending_grad_tokens = tokens_before
                raise

        return self._submit(run, "forward_backward", self._fusable(loss, data, True))

    def _forward(self, data: List[Datum], loss: Loss) -> APIFuture[ForwardBackwardOutput]:
        return self._submit(lambda: self._engine.run(data, loss, backward=False), "forward", self._fusable(loss, data, False))

    def _optim_step(self, params: AdamParams) -> APIFuture[OptimStepResponse]:
        return self._submit(lambda: self._engine.optim_step(params), "optim_step")

    def gradient_norm(self) -> APIFuture[float]:
        """L2 norm of the gradient accumulated since the last ``optim_step`` (queued behind the
        operations already submitted). The SageMaker emulator reports it as ``actor/grad_norm``."""

        def norm() -> float:
            if self._engine.world_size > 1:  # sharded and not-yet-summed replicated gradients
                return distributed.grad_norm([p for _, p in self._engine.named_trainable])
            grads = [p.grad.detach().float() for _, p in self._engine.named_trainable if p.grad is not None]
            return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0

        return self._submit(norm, "gradient_norm")

    @property
    def num_parameters(self) -> int:
        """Parameters of the model (base + adapter)."""
        return sum(p.numel() for p in self._engine.model.parameters())

    @property
    def steps(self) -> int:  # type: ignore[override]
        """The engine's optimizer steps (restored by ``load_state_with_optimizer``)."""
        return self._engine.steps

    # -- checkpoints ------------------------------------------------------------------------------
    def _meta(self, kind: str, description: str) -> Dict[str, Any]:
        lora = self._engine.lora
        return {
            "kind": kind,
            "base_model": self.base_model,
            "rank": lora.rank,
            "alpha": lora.alpha,
            "train_attn": lora.train_attn,
            "train_mlp": lora.train_mlp,
            "step": self._engine.steps,
            "description": description,
            "session": self.name,
        }

    def _write(self, kind: str, description: str, name: Optional[str], overwrite: bool = False) -> str:
        engine = self._engine
        name = name or f"{kind}-step{engine.steps:06d}-{uuid.uuid4().hex[:8]}"
        checkpoint = ckpt.write_checkpoint(
            self.checkpoint_root,
            name,
            peft_model=engine.model,
            optimizer=engine.optimizer if kind == "state" else None,
            meta=self._meta(kind, description),
            overwrite=overwrite,
        )
        self._runtime.sampler.remember(checkpoint, engine.adapter_snapshot())
        return checkpoint

    def _save(self, kind: str, description: str, *, name: Optional[str], merge_weights: bool, overwrite: bool,
              ttl_seconds: Optional[int]) -> APIFuture:
        """A checkpoint directory under ``checkpoint_root`` (``ttl_seconds``/``merge_weights``: no local meaning)."""
        if kind == "state":
            return self._submit(lambda: SaveStateResponse(model_package_arn=self._write("state", description, name, overwrite)), "save_state")
        return self._submit(lambda: SaveWeightsResponse(model_package_arn=self._write("weights", description, name)), "save_weights_for_sampler")

    def _load(self, checkpoint: str, with_optimizer: bool) -> APIFuture[LoadStateResponse]:
        meta = ckpt.read_meta(checkpoint)  # not found / corrupt metadata: raised now, at the call site
        lora = self._engine.lora
        if canonical_name(meta["base_model"]) != canonical_name(self.base_model) or meta["rank"] != lora.rank:
            raise InvalidInputError(
                f"checkpoint {checkpoint!r} is for {meta['base_model']} rank {meta['rank']}; "
                f"this session is {self.base_model} rank {lora.rank}"
            )
        if with_optimizer and meta["kind"] != "state":
            raise InvalidInputError(f"checkpoint {checkpoint!r} holds weights only; load_state_with_optimizer needs a save_state checkpoint")
        engine = self._engine

        def run() -> LoadStateResponse:
            if dcp_state.is_dcp(meta):  # saved on N ranks: DCP's shards, resharded to this session
                _apply_sharded(engine, checkpoint, meta, with_optimizer)
                return LoadStateResponse(model_package_arn=checkpoint)
            # Read and verify every file before touching the session: a corrupt file changes nothing.
            tensors = ckpt.load_adapter_tensors(checkpoint, meta)
            optimizer_state = ckpt.load_optimizer_state(checkpoint, meta) if with_optimizer else None
            _apply_checkpoint(engine, checkpoint, tensors, optimizer_state, int(meta.get("step", 0)))
            return LoadStateResponse(model_package_arn=checkpoint)

        return self._submit(run, "load_state_with_optimizer" if with_optimizer else "load_state")

    def _publish(self, description: str, merge_weights: bool) -> LocalSamplingClient:
        """A sampler on the current weights, held in memory only (no files: an RL loop calls this
        every step) until the returned client is garbage-collected."""
        key = f"{EPHEMERAL}{self.name}/{next(_ephemeral_counter)}"
        adapter = self._submit(self._engine.adapter_snapshot, "save_weights_and_get_sampling_client").result()
        self._runtime.sampler.pin(key, adapter)
        return LocalSamplingClient(self._runtime, key)

    def _sampler(self, checkpoint: str) -> LocalSamplingClient:
        """A sampler on a checkpoint directory, in-memory weights, or ``""`` (the base model)."""
        if checkpoint.startswith(EPHEMERAL):
            if not self._runtime.sampler.is_pinned(checkpoint):
                raise CheckpointNotFoundError(f"in-memory weights {checkpoint!r} are gone (their sampling client was released)")
        elif checkpoint:
            ckpt.verify(checkpoint, ckpt.SAMPLER_FILES)
        return LocalSamplingClient(self._runtime, checkpoint)

    # -- lifecycle --------------------------------------------------------------------------------
    def cancel_queued(self) -> int:
        """Cancel the operations queued behind the running one (each future raises
        ``CancelledError``; the running one finishes); return how many were cancelled."""
        return self._worker.cancel_pending()

    def _stop(self) -> None:
        """Finish queued operations, then leave the service's registry."""
        self._worker.close(wait=True)
        self._service._forget(self)


#: the local engine computes the four built-ins and runs any Loss object in one pass (its engine
#: differentiates the loss directly; whole-batch losses see the whole batch at once)
LOCAL_CAPABILITIES = Capabilities(
    engine="local",
    builtin_losses=builtin_config_keys(),
    native_custom_losses=True,
    constrained_decoding=True,
    full_finetune=True,
)


class LocalServiceClient(ServiceClientBase):
    """Entry point of the local backend (``rlkit.connect("local", ...)``).

    Args:
        precision: ``"auto"`` (default: fp32 or bf16, whichever this machine runs clearly faster;
            see :mod:`~rlkit.backends.local.precision`), ``"fp32"``, or ``"bf16"`` (autocast
            training with fp32 master weights, bf16 sampler weights). :attr:`precision` is the
            value chosen, :attr:`precision_reason` why.
        device: where weights, caches, autocast and random draws live: ``"cpu"``, ``"cuda"``,
            ``"cuda:1"``, ``"mps"``; ``None`` (default) = CUDA when available, else the CPU.
        checkpoint_dir: where checkpoints go (default ``$RLKIT_CACHE/checkpoints``).
        micro_batch_tokens: padded tokens per forward/backward micro-batch (bounds memory).
        activation_checkpointing: ``"auto"`` (default: per micro-batch, as many decoder layers as
            its estimated saved activations need to fit half the memory free now, or the limit),
            ``True`` (every layer: activations ~20x smaller, one more forward), ``False``; see
            :mod:`~rlkit.backends.local.activations`.
        memory_limit_gb: with ``auto``, the most memory (GiB: resident on the CPU, allocated on a
            GPU) a training step may bring the process to; ``auto`` checkpoints just the layers it
            takes to stay under it. ``None`` (default): bounded by the free memory alone.
        max_batch_rows: most sequences decoded together by the sampler.
        num_threads: torch intra-op threads (default: torch's choice).
        fuse_runs: one training thread per base model for all its sessions, fusing their
            concurrent ``forward``/``forward_backward`` into shared passes (:mod:`.fusion`), and
            different sessions' samples into shared decode batches (per-row LoRA, :mod:`.row_lora`);
            ``False`` (default): each session its own thread, passes of its own, and the sampler
            decodes one set of weights at a time (merged), as before issue 43.
    """

    training_client_class = LocalTrainingClient  # a subclass's sessions (backend.sampler=vllm: rlkit.backends.vllm)

    def __init__(
        self,
        *,
        precision: str = "auto",
        checkpoint_dir: Optional[str | Path] = None,
        micro_batch_tokens: int = 2048,
        max_batch_rows: int = 128,
        num_threads: Optional[int] = None,
        device: Optional[str] = None,
        activation_checkpointing: bool | str = "auto",
        memory_limit_gb: Optional[float] = None,
        fuse_runs: bool = False,
    ):
        from rlkit.backends.local.activations import check_mode
        from rlkit.backends.local.allocator import fix_mmap_threshold
        from rlkit.backends.local.models import cache_dir

        check_precision(precision)
        self.activation_checkpointing = check_mode(activation_checkpointing, memory_limit_gb)
        fix_mmap_threshold()  # freed activations go back to the system (rlkit.backends.local.allocator)
        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.device = resolve_device(device)
        choice = resolve_precision(precision, self.device)
        self.precision, self.precision_reason = choice.precision, choice.reason
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else cache_dir() / "checkpoints"
        self.micro_batch_tokens = micro_batch_tokens
        self.max_batch_rows = max_batch_rows
        self.fuse_runs = bool(fuse_runs)
        ServiceClientBase.__init__(self)
        self._runtimes: Dict[str, ModelRuntime] = {}
        self._lock = threading.Lock()

    def _runtime(self, base_model: str) -> ModelRuntime:
        name = canonical_name(base_model)
        with self._lock:
            if name not in self._runtimes:
                loaded = load_model(name, device=self.device)
                sampler = sampler_for(loaded, self.precision)  # on N ranks built at its first use (rank_memory)
                scale_loader = self._adapter_loader
                worker = SamplerWorker(sampler, scale_loader, max_batch_rows=self.max_batch_rows, mix=self.fuse_runs)
                trainer = None
                if self.fuse_runs:
                    trainer = FusingWorker(loaded.model, precision=self.precision, device=self.device,
                                           activation_checkpointing=self.activation_checkpointing,
                                           micro_batch_tokens=self.micro_batch_tokens)
                self._runtimes[name] = ModelRuntime(loaded=loaded, sampler=worker, trainer=trainer)
                release_idle_pool()  # this thread loaded the model; the workers compute from now on
            return self._runtimes[name]

    @staticmethod
    def _adapter_loader(checkpoint: str):
        return ckpt.sampler_weights(checkpoint)

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL_CAPABILITIES

    def list_base_models(self) -> List[str]:
        return ["smollm2-135m-instruct", "tiny"]

    def _create_lora(self, request: LoraRequest) -> LocalTrainingClient:
        """A new LoRA session (checked by :meth:`rlkit.engine.service.ServiceClientBase.create_lora_training_client`;
        SageMaker's session options are accepted and ignored)."""
        runtime = self._runtime(request.base_model)
        lora = LoraSpec(
            rank=request.rank,
            alpha=request.alpha,
            train_attn=True if request.train_attn is None else request.train_attn,
            train_mlp=True if request.train_mlp is None else request.train_mlp,
            train_unembed=bool(request.train_unembed),
            seed=0 if request.seed is None else int(request.seed),
        )
        training_session_name = request.name
        # the runtime's frozen base, shared (same tensors, never written): this session adds only its
        # adapter, optimizer state and activations
        model = share_base(runtime.loaded.model)
        engine = TrainingEngine(model, lora, precision=self.precision, micro_batch_tokens=self.micro_batch_tokens, device=self.device,
                                activation_checkpointing=self.activation_checkpointing)
        after_engine(runtime.loaded, engine)  # on N ranks the engine keeps its shards, the runtime lets the whole copy go
        release_idle_pool()
        name = training_session_name or f"rlkit-local-{next(_session_counter)}-{uuid.uuid4().hex[:6]}"
        with self._registry_lock:
            if any(c.name == name for c in self._running()):
                raise InvalidInputError(f"a session named {name!r} is already running")
            client = self.training_client_class(self, runtime, engine, name, runtime.loaded.name)
            self._track(client)
        return client

    def _checkpoint_shape(self, checkpoint: str) -> Dict[str, Any]:
        """What a checkpoint's metadata records (for ``create_training_client_from_state*``)."""
        meta = ckpt.read_meta(checkpoint)
        return {key: meta.get(key) for key in ("base_model", "rank", "alpha", "train_attn", "train_mlp")}

    def _create_sampling_client(self, base_model: Optional[str], checkpoint: Optional[str]) -> LocalSamplingClient:
        """A sampler on ``base_model``, or on ``checkpoint`` (checked by
        :meth:`rlkit.engine.service.ServiceClientBase.create_sampling_client`: exactly one is given)."""
        if checkpoint and checkpoint.startswith(EPHEMERAL):
            for runtime in list(self._runtimes.values()):
                if runtime.sampler.is_pinned(checkpoint):
                    return LocalSamplingClient(runtime, checkpoint)
            raise CheckpointNotFoundError(f"in-memory weights {checkpoint!r} are gone (their sampling client was released)")
        if checkpoint:
            meta = ckpt.verify(checkpoint, ckpt.SAMPLER_FILES)  # a corrupt adapter is refused here
            return LocalSamplingClient(self._runtime(meta["base_model"]), checkpoint)
        return LocalSamplingClient(self._runtime(base_model), "")

    def get_tokenizer(self, base_model: str = "smollm2-135m-instruct") -> Any:
        return self._runtime(base_model).tokenizer

    def _close(self, first: bool) -> list:
        """Close the samplers of every base model (after the sessions stopped)."""
        with self._lock:
            runtimes, self._runtimes = list(self._runtimes.values()), {}
        for runtime in runtimes:
            runtime.sampler.close()
            if runtime.trainer is not None:
                runtime.trainer.close()
        return []

    def __enter__(self) -> "LocalServiceClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
