"""The embedded local backend: an in-process PyTorch engine (CPU, or one GPU later)."""

from rlkit.backends.local.clients import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from rlkit.errors import ConfigError

SAMPLERS = ("local", "vllm")


def connect(*, sampler: str = "local", vllm=None, **options) -> LocalServiceClient:
    """``rlkit.connect("local", precision=..., checkpoint_dir=..., ...)``; see :class:`LocalServiceClient`.
    ``sampler="vllm"`` (with ``vllm={"urls": [...]}`` or ``{"launch": True}``) keeps training here
    and samples on vLLM servers (:mod:`rlkit.backends.vllm`)."""
    if sampler == "vllm":
        from rlkit.backends.vllm import VllmServiceClient

        return VllmServiceClient(vllm=vllm, **options)
    if sampler != "local":
        raise ConfigError(f"backend.sampler={sampler!r}: choose one of {', '.join(SAMPLERS)}")
    return LocalServiceClient(**options)


__all__ = ["LocalSamplingClient", "LocalServiceClient", "LocalTrainingClient", "connect"]
