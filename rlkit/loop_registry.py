"""The ``@loop`` decorator: a loop declares its name, schema and objective where it is written.

::

    @loop("sft", schema=SFTConfig, objective="eval/nll", direction="minimize")
    def train_sft(cfg, run): ...

The decorator records a :class:`LoopSpec` holding the function and the schema class themselves
(not their dotted names), so a reader or an IDE goes from a recipe's ``loop: sft`` through
:func:`rlkit.loops.get_loop` straight into the code. :mod:`rlkit.loops` imports the shipped loop
modules (and with them their decorators) the first time a loop is looked up.

This module imports nothing of rlkit's at import time: the loops in ``rlkit/loops/`` and
``rlkit/rl/`` import it, and :mod:`rlkit.loops` reads what they registered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, TypeVar, Union

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class LoopSpec:
    """A registered loop. ``entry`` and ``schema`` are the objects themselves (``@loop``), or, for a
    loop added by :func:`rlkit.loops.register_loop` from outside, ``"module:attribute"`` strings
    resolved when the loop is used."""

    entry: Union[Callable[..., Any], str]  # the loop, called as fn(cfg, run)
    schema: Union[type, str]  # the dataclass typing the recipe's ``train`` section
    objective: Optional[str] = None  # its main held-out metric: what a sweep optimises by default
    direction: str = "minimize"  # of ``objective``: minimize | maximize

    def function(self) -> Callable[..., Any]:
        return _resolve(self.entry)

    def schema_class(self) -> type:
        return _resolve(self.schema)


def _resolve(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    from rlkit.imports import import_object

    return import_object(value)


#: name -> spec of every loop registered so far (read it through :data:`rlkit.loops.LOOPS`, which
#: imports the shipped loops first)
REGISTERED: Dict[str, LoopSpec] = {}


def loop(name: str, *, schema: type, objective: Optional[str] = None, direction: str = "minimize") -> Callable[[F], F]:
    """Register the decorated function as loop ``name`` (``loop: <name>`` in a recipe), its ``train``
    section typed by ``schema``; ``objective`` is its main held-out metric (what ``rlkit train -m``
    optimises unless ``sweep.objective`` says otherwise), to ``direction``."""

    def register(fn: F) -> F:
        REGISTERED[name] = LoopSpec(fn, schema, objective, direction)
        return fn

    return register
