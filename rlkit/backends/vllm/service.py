"""The local backend with its sampler on vLLM: :class:`VllmServiceClient`, :class:`VllmTrainingClient`.

Training is the local engine's, unchanged. Each ``save_weights_and_get_sampling_client`` writes the
adapter as version k (PEFT format: ``adapter_model.safetensors`` + ``adapter_config.json``, queued
behind the training operations already submitted, so it holds exactly the weights after them)
into ``backend.vllm.adapter_dir``, loads it on every server as ``<session>-v<k>`` and returns a
client bound to that name; the adapter is unloaded once no client holds it. A server rlkit did not
start from the trainer's weights is checked to serve the trainer's base model when first connected
(:mod:`rlkit.backends.vllm.probe`; ``backend.vllm.check_model=false`` skips it).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import logging
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

from rlkit.backends.local import checkpoints as ckpt
from rlkit.backends.local import dcp_state
from rlkit.backends.local.clients import (EPHEMERAL, LOCAL_CAPABILITIES, LocalSamplingClient, LocalServiceClient, LocalTrainingClient,
                                          ModelRuntime)
from rlkit.backends.local.models import DEFAULT_MODEL, cache_dir
from rlkit.backends.vllm.http import VllmServer
from rlkit.backends.vllm.launch import LaunchedServer
from rlkit.backends.vllm.options import VllmOptions
from rlkit.backends.vllm.pool import ServerPool
from rlkit.backends.vllm.probe import check_same_model
from rlkit.backends.vllm.sampling import VllmSamplingClient
from rlkit.errors import BackendUnavailableError, CheckpointNotFoundError, ClientStoppedError, ConfigError, InvalidInputError
from rlkit.files import atomic_dir
from rlkit.engine.capabilities import Capabilities

log = logging.getLogger("rlkit.vllm")


def vllm_capabilities(options: VllmOptions) -> Capabilities:
    """Training is the local engine's (every built-in, native custom losses, any LoRA shape up to
    the servers' ``--max-lora-rank``); sampling is vLLM's: prompt and top-k prompt logprobs, no
    constrained decoding, per-request seeds only where the servers honour them."""
    return Capabilities(
        engine="vllm",
        builtin_losses=LOCAL_CAPABILITIES.builtin_losses,
        native_custom_losses=True,
        prompt_logprobs=True,
        topk_prompt_logprobs=True,
        max_lora_rank=options.max_lora_rank,
        per_request_seed=options.per_request_seed,
        constrained_decoding=False,
        notes=("training: the local engine; sampling: vLLM servers, one LoRA adapter per weight version",),
    )


class VllmTrainingClient(LocalTrainingClient):
    """A local training session whose sampling clients sample on the service's vLLM servers."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._versions = itertools.count()  # weight versions this session published

    @property
    def capabilities(self) -> Capabilities:
        return self._service.capabilities

    def save_weights_and_get_sampling_client(self, description: str = "", merge_weights: bool = False, *,
                                             name: Optional[str] = None) -> VllmSamplingClient:
        """Publish the current weights as the next adapter version and a client bound to it
        (``name=``: also a durable checkpoint, as on the local backend)."""
        self._check()
        service: VllmServiceClient = self._service  # type: ignore[assignment]
        if name is not None:
            checkpoint = self.save_weights_for_sampler(description, name=name).result().model_package_arn
            return service.checkpoint_client(self._runtime, checkpoint)
        version = next(self._versions)
        root = service.adapter_dir / self.name
        engine = self._engine

        def write() -> str:
            meta = dict(self._meta("weights", description), version=version)
            return ckpt.write_checkpoint(root, f"v{version}", peft_model=engine.model, optimizer=None, meta=meta, overwrite=True)

        checkpoint = self._submit(write, "save_weights_and_get_sampling_client").result()
        return service.adapter_client(self._runtime, f"{self.name}-v{version}", ckpt.resolve(checkpoint), version=version)

    def _sampler(self, checkpoint: str) -> VllmSamplingClient:
        """A client on the servers: the base model (``""``) or a saved checkpoint's adapter."""
        service: VllmServiceClient = self._service  # type: ignore[assignment]
        if not checkpoint:
            return service.base_client(self._runtime)
        return service.checkpoint_client(self._runtime, checkpoint)


class VllmServiceClient(LocalServiceClient):
    """``rlkit.connect("local", sampler="vllm", vllm={...})``: see :mod:`rlkit.backends.vllm`."""

    training_client_class = VllmTrainingClient

    def __init__(self, *, vllm: Any = None, **local_options: Any):
        self.vllm = VllmOptions.coerce(vllm)
        super().__init__(**local_options)
        self._capabilities = vllm_capabilities(self.vllm)
        self.adapter_dir = Path(self.vllm.adapter_dir) if self.vllm.adapter_dir else self.checkpoint_dir / "vllm-adapters"
        self._pools: Dict[str, ServerPool] = {}
        self._launched: List[LaunchedServer] = []
        self._pool_lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.vllm.max_concurrent_requests),
                                                               thread_name_prefix="rlkit-vllm")

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    # -- servers ---------------------------------------------------------------------------------
    def pool(self, runtime: ModelRuntime) -> ServerPool:
        """The servers for ``runtime``'s base model: started or connected on first use."""
        with self._pool_lock:
            if self._closed:
                raise ClientStoppedError("this service client was closed")
            name = runtime.loaded.name
            if name not in self._pools:
                self._pools[name] = self._open_pool(runtime)
            return self._pools[name]

    def _open_pool(self, runtime: ModelRuntime) -> ServerPool:
        o = self.vllm
        servers = [VllmServer(u, timeout_s=o.request_timeout_s) for u in o.urls]
        served = o.served_model_name
        if o.launch:
            served = served or runtime.loaded.name.replace("/", "--")
            log_dir = Path(o.log_dir) if o.log_dir else self.checkpoint_dir.parent
            model = o.model or served_model_dir(runtime)
            print(f"rlkit: starting a vLLM server for {model} (log: {log_dir / 'vllm-server.log'})", flush=True)
            launched = LaunchedServer(model, served, log_dir / "vllm-server.log", python=o.python, port=o.port,
                                      max_lora_rank=o.max_lora_rank, max_loras=o.max_loras, max_model_len=o.max_model_len,
                                      dtype=o.dtype, extra_args=o.extra_args, env=o.env, startup_timeout_s=o.startup_timeout_s)
            launched.server.timeout_s = o.request_timeout_s
            self._launched.append(launched)
            servers.append(launched.server)
        if served is None:
            served = base_model_name(servers[0])
        if o.check_model:  # servers rlkit did not start from the trainer's own weights must serve its base model
            for server in servers[: len(o.urls)] + (servers[len(o.urls):] if o.model else []):
                self._check_model(runtime, server, served)
        return ServerPool(servers, served, adapter_dir_on_server=o.adapter_dir_on_server, local_adapter_dir=str(self.adapter_dir))

    def _check_model(self, runtime: ModelRuntime, server: VllmServer, served: str) -> None:
        """Refuse ``server`` in one line unless its base model scores :mod:`~rlkit.backends.vllm.probe`'s
        text as the trainer's does (``backend.vllm.check_model=false`` skips this)."""
        alone = ServerPool([server], served)
        diff = check_same_model(self._client_on(alone, runtime, None), LocalSamplingClient(runtime), where=server.where(),
                                served=served, trainer_model=runtime.loaded.name, precision=self.precision)
        log.info("%s serves %s: probe logprobs within %.3g nats of the trainer's", server.url, served, diff)

    def _client(self, runtime: ModelRuntime, adapter: Optional[str], version: Optional[int] = None) -> VllmSamplingClient:
        return self._client_on(self.pool(runtime), runtime, adapter, version)

    def _client_on(self, pool: ServerPool, runtime: ModelRuntime, adapter: Optional[str], version: Optional[int] = None) -> VllmSamplingClient:
        loaded = runtime.loaded
        return VllmSamplingClient(
            pool, adapter, tokenizer=lambda: runtime.tokenizer, vocab_size=loaded.vocab_size,
            max_positions=self.vllm.max_model_len or runtime.sampler.sampler.max_positions, stop_token_ids=loaded.stop_token_ids,
            capabilities=self._capabilities, executor=self._executor, version=version,
        )

    def base_client(self, runtime: ModelRuntime) -> VllmSamplingClient:
        return self._client(runtime, None)

    def adapter_client(self, runtime: ModelRuntime, adapter: str, path: Path, *, version: Optional[int] = None,
                       owned: bool = True) -> VllmSamplingClient:
        """A client bound to adapter ``adapter`` (loaded from ``path`` on every server, if not yet)."""
        pool = self.pool(runtime)
        pool.acquire(adapter, path, owned=owned)
        try:
            return self._client(runtime, adapter, version)
        except BaseException:
            pool.release(adapter)
            raise

    def checkpoint_client(self, runtime: ModelRuntime, checkpoint: str) -> VllmSamplingClient:
        if checkpoint.startswith(EPHEMERAL):
            raise CheckpointNotFoundError(f"{checkpoint!r}: in-memory weights are the local sampler's; vLLM loads adapters from files")
        meta = ckpt.verify(checkpoint, ckpt.SAMPLER_FILES)
        if dcp_state.is_dcp(meta):
            raise InvalidInputError(f"{checkpoint!r}: a save_state checkpoint sharded over {meta.get('world_size')} ranks (DCP); "
                                    "vLLM loads PEFT adapter files: sample from save_weights_for_sampler's checkpoint instead")
        path = ckpt.resolve(checkpoint)
        name = "ckpt-" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        return self.adapter_client(runtime, name, path, owned=False)

    def _create_sampling_client(self, base_model: Optional[str], checkpoint: Optional[str]) -> VllmSamplingClient:
        """A client on the servers for ``base_model`` or ``checkpoint`` (exactly one is given)."""
        if checkpoint:
            meta = ckpt.verify(checkpoint, ckpt.SAMPLER_FILES)
            return self.checkpoint_client(self._runtime(meta["base_model"]), checkpoint)
        return self.base_client(self._runtime(base_model))

    def server_status(self) -> List[Dict[str, Any]]:
        """Each server's URL, requests in flight and loaded adapters (for logs and tests)."""
        return [{"url": s.url, "in_flight": s.in_flight, "adapters": sorted(s.adapters)} for p in self._pools.values() for s in p.servers]

    def close(self) -> None:
        """Stop sessions, unload every adapter, stop the servers rlkit started. Idempotent."""
        super().close()
        with self._pool_lock:
            pools, self._pools = list(self._pools.values()), {}
            launched, self._launched = list(self._launched), []
        for pool in pools:
            pool.release_all()
        for server in launched:
            server.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)


def base_model_name(server: VllmServer) -> str:
    """The model a server serves (its ``/v1/models`` entry that is not a LoRA adapter)."""
    models = server.models()
    bases = [m["id"] for m in models if not m.get("parent")]
    if not bases:
        raise BackendUnavailableError(f"{server.where()} lists no base model at /v1/models; set backend.vllm.served_model_name")
    return bases[0]


def _fingerprint(model: Any) -> str:
    """A short hash of a (small) model's config and weights."""
    digest = hashlib.sha256(model.config.to_json_string().encode())
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def served_model_dir(runtime: ModelRuntime) -> str:
    """A directory (or hub id) vLLM can serve ``runtime``'s base model from: the embedded model's
    safetensors copy, a local directory as given, or — for rlkit's tiny models, which exist only in
    memory — the weights and tokenizer exported once under ``$RLKIT_CACHE/vllm-models/<name>-<hash>``
(the hash of their config and weights, so a changed tiny model is exported anew)."""
    name = runtime.loaded.name
    if name == DEFAULT_MODEL:
        from rlkit.backends.local.models import _smollm2_cached_dir

        return str(_smollm2_cached_dir())
    if Path(name).is_dir():
        return str(Path(name).resolve())
    if not name.startswith("tiny"):
        return name  # a hub id: the server resolves it
    target = cache_dir() / "vllm-models" / f"{name}-{_fingerprint(runtime.loaded.model)}"  # a changed tiny model is a new export
    if (target / "config.json").exists():
        return str(target)
    with atomic_dir(target, prefix=".export-") as tmp:
        runtime.loaded.model.save_pretrained(tmp)
        runtime.tokenizer.save_pretrained(tmp)
    if not (target / "config.json").exists():
        raise ConfigError(f"cannot export {name} for vLLM to {target}")
    return str(target)
