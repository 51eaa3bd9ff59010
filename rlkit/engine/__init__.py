"""The engine contract in one package: what an engine must be, and everything it gets for free.

===================  =================================================================================
``protocols``        the ``ServiceClient`` / ``TrainingClient`` / ``SamplingClient`` protocols (the
                     SageMaker SDK's names, argument order and defaults)
``capabilities``     :class:`Capabilities` (what an engine declares it honours), the LoRA defaults
``checks``           the request checks and coercions every engine shares (prompts, sampling
                     requests, batches, session keywords, :class:`LoraRequest`)
``clients``          :class:`SamplingClientBase`, :class:`TrainingClientBase`: every public method
                     and check of a sampling / training client, over the engine's primitives
``service``          :class:`ServiceClientBase`: creating clients, the sessions a client runs
``dispatch``         how a loss is routed: native built-in, native ``Loss`` object, or linearised
``registry``         :class:`BackendSpec`, :func:`register_backend`, :func:`backend_spec`,
                     :func:`connect` (``rlkit.connect``)
===================  =================================================================================

An engine subclasses the three bases, implements their primitives and declares its capabilities
(``docs/adding-an-engine.md``). Imports run one way: this package imports :mod:`rlkit.types`,
:mod:`rlkit.errors`, :mod:`rlkit.futures` and :mod:`rlkit.losses` (the front door builds and
validates losses), never a backend, a loop or the CLI; :mod:`rlkit.losses` imports nothing of it.
``rlkit.session`` and ``rlkit.front_door`` re-export these names for older imports.
"""

from rlkit.engine.capabilities import DEFAULT_LORA_ALPHA, DEFAULT_LORA_RANK, Capabilities
from rlkit.engine.checks import (
    FROM_STATE_KEYWORDS,
    LOSS_OBJECT_CONFIG,
    SESSION_OPTIONS,
    LoraRequest,
    check_sample_request,
    check_session_options,
    check_text,
    coerce_batch,
    prompt_tokens,
)
from rlkit.engine.clients import EngineClientBase, SamplingClientBase, TrainingClientBase
from rlkit.engine.protocols import SamplingClient, ServiceClient, TrainingClient
from rlkit.engine.registry import BACKENDS, BackendSpec, backend_spec, connect, register_backend
from rlkit.engine.service import ServiceClientBase

__all__ = [
    "BACKENDS",
    "BackendSpec",
    "Capabilities",
    "DEFAULT_LORA_ALPHA",
    "DEFAULT_LORA_RANK",
    "EngineClientBase",
    "FROM_STATE_KEYWORDS",
    "LOSS_OBJECT_CONFIG",
    "LoraRequest",
    "SESSION_OPTIONS",
    "SamplingClient",
    "SamplingClientBase",
    "ServiceClient",
    "ServiceClientBase",
    "TrainingClient",
    "TrainingClientBase",
    "backend_spec",
    "check_sample_request",
    "check_session_options",
    "check_text",
    "coerce_batch",
    "connect",
    "prompt_tokens",
    "register_backend",
]
