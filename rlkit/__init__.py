"""rlkit: post-training language models with RL, SFT, DPO and distillation.

You write the loop; a training session executes it::

    import rlkit
    service = rlkit.connect("local")          # or "sagemaker"
    trainer = service.create_lora_training_client("smollm2-135m-instruct", rank=16)
"""
# ruff: noqa: E402 - the allocator is settled before anything else of rlkit is imported

from rlkit import malloc_preload as _malloc_preload

_malloc_preload.reexec_for_script()  # a script that imports rlkit runs on the rlkit command's allocator (mimalloc)

from rlkit.backends import connect, register_backend
from rlkit.errors import RlkitError
from rlkit.futures import APIFuture
from rlkit.types import (
    AdamParams,
    Datum,
    EncodedTextChunk,
    ForwardBackwardOutput,
    ModelInput,
    SampledSequence,
    SampleResponse,
    SamplingParams,
    StopReason,
    TensorData,
    TensorDtype,
)

from rlkit.version import __version__ as __version__


def __getattr__(name: str):
    """``rlkit.LossFunction``: the built-ins' enum, derived from the loss classes
    (:mod:`rlkit.losses.builtin`); resolved on first use so ``import rlkit`` stays without torch."""
    if name == "LossFunction":
        from rlkit.losses.builtin import LossFunction

        return LossFunction
    raise AttributeError(f"module 'rlkit' has no attribute {name!r}")

__all__ = [
    "APIFuture",
    "AdamParams",
    "Datum",
    "EncodedTextChunk",
    "ForwardBackwardOutput",
    "LossFunction",
    "ModelInput",
    "RlkitError",
    "SampleResponse",
    "SampledSequence",
    "SamplingParams",
    "StopReason",
    "TensorData",
    "TensorDtype",
    "connect",
    "register_backend",
]
