"""The four losses every backend offers by name — one registry entry each, derived from the class.

A built-in's identity is its class: ``cls.builtin`` (the service's name for it), the
``loss_fn_config`` keys it accepts (``cls.builtin_config_keys``) and their defaults, read from the
class's own ``__init__`` signature, so each default is written once (``PPO(clip_low_threshold=0.8,
clip_high_threshold=1.2)``). :data:`BUILTIN_LOSSES` and every backend's capability set derive
from these entries; ``rlkit.types.LossFunction`` names the same four (a house test checks it).
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Optional, Tuple

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, check_config
from rlkit.losses.cispo import CISPO
from rlkit.losses.cross_entropy import CrossEntropy
from rlkit.losses.importance_sampling import ImportanceSampling
from rlkit.losses.ppo import PPO

BUILTIN_CLASSES: Tuple[type, ...] = (CrossEntropy, ImportanceSampling, PPO, CISPO)


def config_defaults(cls: type) -> Dict[str, float]:
    """``{loss_fn_config key: default}`` of a built-in class, from its ``__init__`` signature."""
    params = inspect.signature(cls.__init__).parameters
    return {key: float(params[key].default) for key in cls.builtin_config_keys}


#: name -> (class, accepted loss_fn_config keys with defaults)
BUILTIN_LOSSES: Dict[str, Tuple[type, Dict[str, float]]] = {
    cls.builtin: (cls, config_defaults(cls)) for cls in BUILTIN_CLASSES
}


def builtin_config_keys() -> Dict[str, Tuple[str, ...]]:
    """``{built-in name: its loss_fn_config keys}`` — what a backend that computes all four declares."""
    return {name: tuple(defaults) for name, (_, defaults) in BUILTIN_LOSSES.items()}


def builtin_loss(name: Any, config: Optional[Mapping[str, Any]] = None) -> Loss:
    """The built-in loss ``name`` configured by ``loss_fn_config``; clear error for anything else."""
    key = getattr(name, "value", name)
    if key not in BUILTIN_LOSSES:
        raise InvalidInputError(f"unknown loss_fn {key!r}; built-ins are {sorted(BUILTIN_LOSSES)}")
    cls, defaults = BUILTIN_LOSSES[key]
    return cls(**check_config(key, config, defaults))
