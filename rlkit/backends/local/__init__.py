"""The embedded local backend: an in-process PyTorch engine (CPU, or one GPU).

``rlkit.connect("local", sampler="vllm", ...)`` (training here, sampling on vLLM servers) is chosen
by the backend registry (:func:`rlkit.backends.connect_local`): :mod:`rlkit.backends.vllm` is built
on this engine, so this package never imports it."""

from rlkit.backends.local.clients import LocalSamplingClient, LocalServiceClient, LocalTrainingClient


def connect(**options) -> LocalServiceClient:
    """The local engine's service client; see :class:`LocalServiceClient` for the options."""
    return LocalServiceClient(**options)


__all__ = ["LocalSamplingClient", "LocalServiceClient", "LocalTrainingClient", "connect"]
