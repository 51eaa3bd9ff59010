"""Build a loss from a config: by name (``loss=ppo``, ``loss.clip_high_threshold=1.28``) or by
``_target_`` pointing at a user's class (``loss._target_=my_research.losses.AsymmetricPPO``).

A config is a mapping ``{name | _target_, **constructor kwargs, extra_terms: [...]}``;
``extra_terms`` adds weighted terms, e.g. ``[{weight: 0.01, name: kl_penalty}]`` builds
``PPO() + 0.01 * KLPenalty()``. ``aggregation`` / ``aggregation_constant`` are not constructor
arguments: loops pass them to :func:`rlkit.losses.execute.run_loss`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from rlkit.errors import ConfigError, InvalidInputError
from rlkit.imports import check_kwargs, import_object, suggest
from rlkit.losses.base import Loss
from rlkit.losses.cispo import CISPO
from rlkit.losses.cross_entropy import CrossEntropy
from rlkit.losses.distillation import ReverseKLDistillation
from rlkit.losses.dpo import DPO
from rlkit.losses.gspo import GSPO
from rlkit.losses.importance_sampling import ImportanceSampling
from rlkit.losses.kl import KLPenalty
from rlkit.losses.ppo import PPO

#: ``loss=name`` -> class; each name is the class's own ``name`` (its metrics namespace), written once
LOSSES: Dict[str, type] = {
    cls.name: cls for cls in (CrossEntropy, ImportanceSampling, PPO, CISPO, GSPO, DPO, ReverseKLDistillation, KLPenalty)
}
LOOP_KEYS = ("aggregation", "aggregation_constant")


def register_loss(name: str, cls: type) -> None:
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
    if "_target_" in spec:
        cls = import_object(spec.pop("_target_"), f"{where}._target_")
        spec.pop("name", None)
    else:
        name = spec.pop("name", None)
        if name not in LOSSES:
            raise ConfigError(f"{where}.name={name!r}: unknown loss; choose from {sorted(LOSSES)} or set "
                              f"{where}._target_{suggest(name, LOSSES)}")
        cls = LOSSES[name]
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
