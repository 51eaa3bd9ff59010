"""The four losses every backend offers by name, built from a name and a ``loss_fn_config``."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, check_config
from rlkit.losses.cispo import CISPO
from rlkit.losses.cross_entropy import CrossEntropy
from rlkit.losses.importance_sampling import ImportanceSampling
from rlkit.losses.ppo import PPO

_CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

#: name -> (class, accepted loss_fn_config keys with defaults)
BUILTIN_LOSSES: dict[str, tuple[type[Loss], dict[str, float]]] = {
    "cross_entropy": (CrossEntropy, {}),
    "importance_sampling": (ImportanceSampling, {}),
    "ppo": (PPO, _CLIP_DEFAULTS),
    "cispo": (CISPO, _CLIP_DEFAULTS),
}


def builtin_loss(name: Any, config: Optional[Mapping[str, Any]] = None) -> Loss:
    """The built-in loss ``name`` configured by ``loss_fn_config``; clear error for anything else."""
    key = getattr(name, "value", name)
    if key not in BUILTIN_LOSSES:
        raise InvalidInputError(f"unknown loss_fn {key!r}; built-ins are {sorted(BUILTIN_LOSSES)}")
    cls, defaults = BUILTIN_LOSSES[key]
    return cls(**check_config(key, config, defaults))
