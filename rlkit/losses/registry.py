"""Build a loss from a config: by name (``loss=ppo``, ``loss.clip_high_threshold=1.28``) or by
``_target_`` pointing at a user's class (``loss._target_=my_research.losses.AsymmetricPPO``).

A config is a mapping ``{name | _target_, **constructor kwargs, extra_terms: [...]}``;
``extra_terms`` adds weighted terms, e.g. ``[{weight: 0.01, name: kl_penalty}]`` builds
``PPO() + 0.01 * KLPenalty()``. ``aggregation`` / ``aggregation_constant`` are not constructor
arguments: loops pass them to :func:`rlkit.losses.execute.run_loss`.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Tuple, Type

from rlkit.errors import ConfigError, InvalidInputError
from rlkit.imports import check_kwargs, lookup
from rlkit.losses.base import Loss
from rlkit.losses.cispo import CISPO
from rlkit.losses.cross_entropy import CrossEntropy
from rlkit.losses.distillation import ReverseKLDistillation
from rlkit.losses.dpo import DPO
from rlkit.losses.gspo import GSPO
from rlkit.losses.importance_sampling import ImportanceSampling
from rlkit.losses.kl import KLPenalty
from rlkit.losses.ppo import PPO

#: the shipped losses: the one list. Everything else is read off these classes — ``loss=name`` (the
#: class's own ``name``), the built-ins (:mod:`rlkit.losses.builtin`: a class whose ``builtin`` is its own
#: name), ``rlkit.losses.LossFunction``, and each ``configs/loss/<name>.yaml``'s keys and defaults
#: (:func:`config_node`, stored by :func:`rlkit.config.store_base_schemas` as ``/schema/loss/<name>``)
LOSS_CLASSES: Tuple[Type[Loss], ...] = (CrossEntropy, ImportanceSampling, PPO, CISPO, GSPO, DPO, ReverseKLDistillation, KLPenalty)

#: ``loss=name`` -> class; each name is the class's own ``name`` (its metrics namespace), written once
LOSSES: Dict[str, Type[Loss]] = {cls.name: cls for cls in LOSS_CLASSES}
LOOP_KEYS = ("aggregation", "aggregation_constant")


def config_defaults(cls: Type[Loss]) -> Dict[str, Any]:
    """``{argument: default}`` of ``cls.__init__``'s arguments whose default is a number, a string or
    a bool: the keys a loss config shows and ``loss.key=value`` overrides. An argument whose default
    is ``None`` (PPO's ``dual_clip``, an off-policy ``correction``) is opt-in: ``+loss.key=value``."""
    params = inspect.signature(cls.__init__).parameters
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: p.default for k, p in params.items() if p.kind in kinds and isinstance(p.default, (bool, int, float, str))}


def config_node(cls: Type[Loss]) -> Dict[str, Any]:
    """The config of a loss with its class's own defaults, ``{_target_, **config_defaults(cls)}``:
    what ``configs/loss/<name>.yaml`` composes from ``/schema/loss/<name>`` instead of repeating
    them. ``_target_`` is the public path ``rlkit.losses.<Class>`` where the package exports it."""
    import rlkit.losses as package

    public = getattr(package, cls.__name__, None) is cls
    target = f"rlkit.losses.{cls.__name__}" if public else f"{cls.__module__}.{cls.__qualname__}"
    return {"_target_": target, **config_defaults(cls)}


def register_loss(name: str, cls: Type[Loss]) -> None:
    """Make ``loss=name`` build ``cls``."""
    LOSSES[name] = cls


def build_loss(spec: Any, where: str = "loss") -> Loss:
    """A :class:`Loss` from a name, a mapping (see module docstring) or an existing Loss."""
    if isinstance(spec, Loss):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a loss name or mapping, got {type(spec).__name__}")
    spec = dict(spec)
    extra_terms = spec.pop("extra_terms", None) or []
    for key in LOOP_KEYS:
        spec.pop(key, None)
    cls = lookup(spec, LOSSES, where, "loss")
    if not (isinstance(cls, type) and issubclass(cls, Loss)):
        raise ConfigError(f"{where}: {cls!r} is not a rlkit.losses.Loss subclass")
    kwargs = check_kwargs(cls, spec, where)  # keys along the __init__ chain, values coerced to their types
    try:
        loss = cls(**kwargs)
    except (InvalidInputError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {' '.join(str(exc).split())}") from None
    for i, term in enumerate(extra_terms):
        term = dict(term)
        weight = float(term.pop("weight", 1.0))
        loss = loss + weight * build_loss(term, f"{where}.extra_terms[{i}]")
    return loss
