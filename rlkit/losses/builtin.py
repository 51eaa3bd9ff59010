"""The losses every backend offers by name — read off the shipped loss classes, never listed again.

A built-in is a shipped loss (:data:`rlkit.losses.registry.LOSS_CLASSES`) whose class *is* the
built-in of its own name (``cls.builtin == cls.name``; reverse-KL distillation, which runs *as*
``importance_sampling`` on a rewritten batch, is not one). Its identity is its class: the
``loss_fn_config`` keys it accepts (``cls.builtin_config_keys``) and their defaults, read from the
class's own ``__init__`` signature, so each default is written once (``PPO(clip_low_threshold=0.8,
clip_high_threshold=1.2)``). :data:`BUILTIN_LOSSES`, :class:`LossFunction` (the SDK's enum of
built-in names), every backend's capability set, Tinker's converters and its server's list of
supported losses all derive from these classes.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss, NativeCall, check_config
from rlkit.losses.registry import LOSS_CLASSES

#: the built-in classes; each one's ``builtin`` *is* its ``name``, so below a built-in is named by ``cls.name``
BUILTIN_CLASSES: Tuple[Type[Loss], ...] = tuple(cls for cls in LOSS_CLASSES if cls.builtin == cls.name)

#: the built-ins' names as the SDK's enum (``LossFunction.PPO == "ppo"``); ``forward_backward``
#: takes a member or its string alike
LossFunction = Enum(  # type: ignore[misc]  # mypy wants a literal member list; this one is derived
    "LossFunction", {cls.name.upper(): cls.name for cls in BUILTIN_CLASSES}, type=str, module=__name__
)
LossFunction.__doc__ = "The built-in losses every backend offers by name (derived from the loss classes)."


def config_defaults(cls: Type[Loss]) -> Dict[str, float]:
    """``{loss_fn_config key: default}`` of a built-in class, from its ``__init__`` signature."""
    params = inspect.signature(cls.__init__).parameters
    return {key: float(params[key].default) for key in cls.builtin_config_keys}


#: name -> (class, accepted loss_fn_config keys with defaults)
BUILTIN_LOSSES: Dict[str, Tuple[Type[Loss], Dict[str, float]]] = {
    cls.name: (cls, config_defaults(cls)) for cls in BUILTIN_CLASSES
}


def builtin_config_keys() -> Dict[str, Tuple[str, ...]]:
    """``{built-in name: its loss_fn_config keys}`` — what a backend that computes all four declares."""
    return {name: tuple(defaults) for name, (_, defaults) in BUILTIN_LOSSES.items()}


def builtin_loss(name: Any, config: Optional[Mapping[str, Any]] = None) -> Loss:
    """The built-in loss ``name`` configured by ``loss_fn_config``; clear error for anything else.
    The object remembers the call it was built from (:func:`builtin_call`), so an engine that
    sends built-ins by name sends ``config`` as the caller gave it."""
    key = getattr(name, "value", name)
    if key not in BUILTIN_LOSSES:
        raise InvalidInputError(f"unknown loss_fn {key!r}; built-ins are {sorted(BUILTIN_LOSSES)}")
    cls, defaults = BUILTIN_LOSSES[key]
    loss = cls(**check_config(key, config, defaults))
    loss._builtin_call = NativeCall(key, None if config is None else dict(config))
    return loss


def builtin_call(loss: Loss) -> Optional[NativeCall]:
    """The built-in name and ``loss_fn_config`` that compute ``loss`` natively, as an engine that
    takes built-ins by name sends them: for a loss :func:`builtin_loss` built, the name and config
    it was given (no config: the engine's documented defaults); else :meth:`Loss.native_call`
    (``None``: not a built-in)."""
    given = getattr(loss, "_builtin_call", None)
    return given if given is not None else loss.native_call()


def as_builtin(loss: Loss) -> Loss:
    """The built-in object that computes ``loss`` natively (when :func:`builtin_call` names one):
    ``loss`` itself when it is of its built-in's class, else that built-in with ``loss``'s config
    (reverse-KL distillation runs as ``importance_sampling`` on the batch its ``native_data`` rewrites)."""
    call = builtin_call(loss)
    if call is None or call.name not in BUILTIN_LOSSES or type(loss) is BUILTIN_LOSSES[call.name][0]:
        return loss
    return builtin_loss(call.name, call.config)
