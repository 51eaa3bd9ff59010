"""Backends: the shipped engines, each registered once as a :class:`~rlkit.engine.registry.BackendSpec`.

``local`` is the embedded PyTorch engine (``sampler="vllm"``: training here, sampling on vLLM
servers); ``sagemaker`` goes through the official ``sagemaker-train`` SDK (``pip install
'rlkit[sagemaker]'``), ``tinker`` through the official ``tinker`` SDK (``pip install 'rlkit[tinker]'``).

The registry itself (:class:`BackendSpec`, :data:`BACKENDS`, :func:`register_backend`,
:func:`backend_spec`, :func:`connect`) is part of the engine contract, :mod:`rlkit.engine.registry`;
it is re-exported here, where the entries at the bottom register the shipped engines. The
capability adapters below read an engine's options without connecting.
"""

from __future__ import annotations

from typing import Any, Mapping

from rlkit.engine.capabilities import Capabilities
from rlkit.engine.protocols import ServiceClient
from rlkit.engine.registry import BACKENDS, BackendSpec, Ref, backend_spec, connect, load, register_backend
from rlkit.errors import ConfigError

__all__ = ["BACKENDS", "BackendSpec", "Ref", "backend_spec", "connect", "connect_local", "load", "local_capabilities",
           "register_backend", "tinker_capabilities"]


def connect_local(*, sampler: str = "local", vllm: Any = None, **options: Any) -> ServiceClient:
    """``rlkit.connect("local", ...)``: the local engine (:class:`~rlkit.backends.local.LocalServiceClient`);
    ``sampler="vllm"`` (with ``vllm={"urls": [...]}`` or ``{"launch": True}``) keeps training here
    and samples on vLLM servers (:mod:`rlkit.backends.vllm`, built on the local engine)."""
    if sampler == "vllm":
        return load("rlkit.backends.vllm:VllmServiceClient")(vllm=vllm, **options)
    if sampler != "local":
        raise ConfigError(f"backend.sampler={sampler!r}: choose one of local, vllm")
    return load("rlkit.backends.local:connect")(**options)


def local_capabilities(options: Mapping[str, Any]) -> Capabilities:
    """The local engine's capabilities, or with ``sampler="vllm"`` the vLLM sampler's."""
    if options.get("sampler") == "vllm":
        coerce = load("rlkit.backends.vllm.options:VllmOptions").coerce
        return load("rlkit.backends.vllm:vllm_capabilities")(coerce(options.get("vllm")))
    return load("rlkit.backends.local.clients:LOCAL_CAPABILITIES")


def tinker_capabilities(options: Mapping[str, Any]) -> Capabilities:
    """Tinker's capabilities with the service's fixed LoRA alpha (``lora_alpha``, default 32)."""
    caps = load("rlkit.backends.tinker.capabilities:tinker_capabilities")
    return caps(options["lora_alpha"]) if options.get("lora_alpha") else caps()


for _spec in (
    BackendSpec("local", "the local engine", connect=connect_local, schema="rlkit.config:LocalBackendConfig", capabilities=local_capabilities,
                conformance_options={"precision": "fp32"},
                variants={"vllm": {"sampler": "vllm", "vllm": {"launch": True, "dtype": "float32"}}}),
    BackendSpec("sagemaker", "SageMaker", connect="rlkit.backends.sagemaker:connect", schema="rlkit.config:SageMakerBackendConfig",
                capabilities="rlkit.backends.sagemaker.capabilities:SAGEMAKER_CAPABILITIES"),
    BackendSpec("tinker", "Tinker", connect="rlkit.backends.tinker:connect", schema="rlkit.config:TinkerBackendConfig",
                capabilities=tinker_capabilities, conformance_requires={"base_url": ("TINKER_BASE_URL", "TINKER_API_KEY")}),
):
    register_backend(_spec)
