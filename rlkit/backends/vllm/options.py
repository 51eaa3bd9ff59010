"""``backend.vllm.*``: where the vLLM servers are and how rlkit talks to them (the schema is
:class:`rlkit.config.VllmConfig`, with the same fields and defaults; a test keeps them equal)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional

from rlkit.errors import ConfigError


@dataclass
class VllmOptions:
    urls: List[str] = field(default_factory=list)  # servers you run (http://host:port), any number
    launch: Optional[bool] = None  # start a vLLM server here as a child process; null = when urls is empty
    python: Optional[str] = None  # the Python of vLLM's environment; null = ./.venv-vllm/bin/python (scripts/install.sh vllm)
    port: Optional[int] = None  # the launched server's port; null = a free one
    model: Optional[str] = None  # what a launched server serves; null = the trainer's base model (a tiny model is exported)
    served_model_name: Optional[str] = None  # the base model's name on the servers; null = launched: the base model's name, urls: asked
    adapter_dir: Optional[str] = None  # where weight versions are written; null = <checkpoint_dir>/vllm-adapters
    adapter_dir_on_server: Optional[str] = None  # adapter_dir as remote servers mount it (shared filesystem); null = same path
    log_dir: Optional[str] = None  # the launched server's log; null = the run directory
    max_lora_rank: int = 64  # --max-lora-rank of a launched server (>= model.rank)
    max_loras: int = 2  # adapters in one batch (2: the current version and the one before, for async rollouts)
    max_model_len: Optional[int] = None  # --max-model-len of a launched server; null = the model's
    dtype: str = "auto"  # --dtype of a launched server
    per_request_seed: bool = False  # true only for servers whose engine honours seeds (GPU builds); the CPU build crashes on one
    check_model: bool = True  # refuse a server whose base model scores a probe unlike the trainer's (false: off-policy on purpose)
    max_concurrent_requests: int = 64  # requests in flight from this process, over all servers
    request_timeout_s: float = 600.0
    startup_timeout_s: float = 900.0
    extra_args: List[str] = field(default_factory=list)  # more `vllm serve` arguments
    env: Dict[str, str] = field(default_factory=dict)  # more environment for the launched server

    @classmethod
    def coerce(cls, value: Any) -> "VllmOptions":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"backend.vllm must be a mapping, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"backend.vllm: unknown key(s) {unknown}; known: {', '.join(sorted(known))}")
        options = cls(**{k: v for k, v in value.items() if v is not None or k in ("port", "model", "launch")})
        if isinstance(options.urls, str):
            options.urls = [options.urls]
        options.urls = [str(u) for u in options.urls]
        if options.launch is None:
            options.launch = not options.urls
        if not options.urls and not options.launch:
            raise ConfigError("backend.sampler=vllm needs servers: backend.vllm.urls=[http://host:port,...] or backend.vllm.launch=true")
        return options
