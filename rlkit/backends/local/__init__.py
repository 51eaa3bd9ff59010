"""The embedded local backend: an in-process PyTorch engine (CPU, or one GPU later)."""

from rlkit.backends.local.clients import LocalSamplingClient, LocalServiceClient, LocalTrainingClient


def connect(**options) -> LocalServiceClient:
    """``rlkit.connect("local", precision=..., checkpoint_dir=..., ...)``; see :class:`LocalServiceClient`."""
    return LocalServiceClient(**options)


__all__ = ["LocalSamplingClient", "LocalServiceClient", "LocalTrainingClient", "connect"]
