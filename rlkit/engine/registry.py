"""The one registry of engines: :class:`BackendSpec` (everything rlkit knows of an engine without
connecting to it), :func:`register_backend`, :func:`backend_spec` and :func:`connect` (re-exported
as ``rlkit.connect`` / ``rlkit.register_backend``).

:data:`BACKENDS` is the one list: ``rlkit.connect`` calls a spec's ``connect``, :mod:`rlkit.config`
stores each ``schema`` as ``/schema/backend/<name>``, :mod:`rlkit.composition` refuses what the
declared capabilities cannot honour, and ``rlkit conformance`` offers each name (and its
``variants``). The shipped engines register themselves in :mod:`rlkit.backends` (imported by
``import rlkit``); a third-party engine calls :func:`register_backend` (``docs/adding-an-engine.md``).

A spec names its pieces as ``"module:attribute"`` strings (or the objects themselves), resolved on
first use, so this registry imports no engine, SDK or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple, Union

from rlkit.engine.capabilities import Capabilities
from rlkit.engine.protocols import ServiceClient
from rlkit.errors import ConfigError
from rlkit.imports import import_object

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
    - ``capabilities``: a :class:`~rlkit.engine.capabilities.Capabilities`, or ``(options) -> Capabilities``
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
    """Open a :class:`~rlkit.engine.protocols.ServiceClient` on ``backend`` (``"local"`` by default)."""
    return load(backend_spec(backend).connect)(**options)
