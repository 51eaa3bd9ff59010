"""Backends: ``connect(name, **options) -> ServiceClient``, and each engine's spec, registered once.

``local`` is the embedded PyTorch engine (``sampler="vllm"``: training here, sampling on vLLM
servers); ``sagemaker`` goes through the official ``sagemaker-train`` SDK (``pip install
'rlkit[sagemaker]'``), ``tinker`` through the official ``tinker`` SDK (``pip install 'rlkit[tinker]'``).

A :class:`BackendSpec` is everything rlkit knows of an engine without connecting to it: how to
connect, the schema of its ``backend=<name>`` config, and what it honours (its
:class:`~rlkit.session.Capabilities` under given options). :data:`BACKENDS` is the one list:
``rlkit.connect`` calls ``connect``, :mod:`rlkit.config` stores each ``schema`` as
``/schema/backend/<name>``, :mod:`rlkit.composition` refuses what the declared capabilities cannot
honour, and ``rlkit conformance`` offers each name (and its ``variants``). Register a third-party
engine with :func:`register_backend` (``docs/adding-an-engine.md``).

A spec names its pieces as ``"module:attribute"`` strings (or the objects themselves), resolved on
first use, so this registry imports no engine, SDK or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple, Union

from rlkit.errors import ConfigError
from rlkit.imports import import_object
from rlkit.session import Capabilities, ServiceClient

Ref = Union[str, Any]  # "module:attribute", or the object


def load(ref: Ref) -> Any:
    """The object a ``"module:attribute"`` string names (:func:`rlkit.imports.import_object`: one
    line naming the path when it does not resolve); anything else is returned as it is."""
    return import_object(ref, "backend spec") if isinstance(ref, str) else ref


@dataclass(frozen=True)
class BackendSpec:
    """One engine, declared once.

    - ``title``: how one-line refusals name the engine;
    - ``connect``: ``(**options) -> ServiceClient``, what ``rlkit.connect(name, **options)`` calls;
    - ``schema``: the dataclass typing ``backend=<name>`` configs (a ``name`` field plus the options
      ``connect`` takes); ``configs/backend/<name>.yaml`` starts from ``/schema/backend/<name>``;
    - ``capabilities``: a :class:`~rlkit.session.Capabilities`, or ``(options) -> Capabilities``
      when what the engine honours depends on its options (Tinker's ``lora_alpha``); read before
      anything runs, so a setting the engine cannot honour is refused in one line;
    - ``conformance_options``: the options ``rlkit conformance <name>`` connects with, beyond the
      flags it is given (the local engine in fp32, so sums compare at 1e-5);
    - ``conformance_requires``: options ``rlkit conformance <name>`` must be given, each with the
      environment variables that stand in for it (Tinker's ``base_url``: ``$TINKER_BASE_URL``);
    - ``variants``: more engines ``rlkit conformance`` offers, each this backend with fixed options
      (``vllm``: the local engine with ``sampler="vllm"``, a vLLM server launched unless
      ``--vllm-url`` names some).
    """

    name: str
    title: str  # how messages name the engine ("Tinker", "SageMaker")
    connect: Ref
    schema: Ref
    capabilities: Ref
    conformance_options: Mapping[str, Any] = field(default_factory=dict)
    conformance_requires: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def schema_class(self) -> type:
        return load(self.schema)

    def capabilities_for(self, options: Mapping[str, Any]) -> Capabilities:
        """What this engine honours when connected with ``options`` (no connection is made)."""
        declared = load(self.capabilities)
        return declared if isinstance(declared, Capabilities) else declared(options)


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


#: backend name -> spec: the one list of engines
BACKENDS: Dict[str, BackendSpec] = {}


def register_backend(spec: Union[BackendSpec, str], factory: Union[Ref, None] = None) -> None:
    """Register an engine: a :class:`BackendSpec` (``register_backend(BackendSpec(...))``). The
    older ``register_backend(name, factory)`` registers ``connect`` only (no schema: such a
    backend cannot be chosen with ``backend=`` in a config; it honours the contract's defaults)."""
    if isinstance(spec, str):
        spec = BackendSpec(spec, spec, connect=factory, schema=None, capabilities=Capabilities(engine=spec, builtin_losses={}))
    BACKENDS[spec.name] = spec


def backend_spec(name: str) -> BackendSpec:
    """The spec of ``name``; one line naming the registered engines otherwise."""
    spec = BACKENDS.get(name)
    if spec is None:
        raise ConfigError(f"unknown backend {name!r}; available: {', '.join(sorted(BACKENDS))}")
    return spec


def connect(backend: str = "local", **options: Any) -> ServiceClient:
    """Open a :class:`~rlkit.session.ServiceClient` on ``backend`` (``"local"`` by default)."""
    return load(backend_spec(backend).connect)(**options)


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
