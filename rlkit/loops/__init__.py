"""The loops, and the registry the CLI dispatches through.

A recipe names its loop (``loop: sft``). Each loop declares itself where it is written, with the
:func:`~rlkit.loop_registry.loop` decorator naming the dataclass that types its ``train`` section
and its main held-out metric::

    @loop("sft", schema=SFTConfig, objective="eval/nll", direction="minimize")
    def train_sft(cfg: Any, run: Run) -> Dict[str, Any]: ...

:data:`LOOPS` maps each name to its :class:`LoopSpec` (the function and the schema class
themselves). The shipped loops are the modules :func:`import_shipped_loops` imports, on the first
look-up, so ``import rlkit.loops`` and ``rlkit --help`` import none of them.

A loop is one readable function ``fn(cfg, run) -> dict`` (``cfg``: the composed config,
``run``: the :class:`rlkit.runs.Run` that owns the run directory). It first builds and checks
what it needs (data, task, loss: nothing is written yet), then runs its algorithm inside the one
scaffold every loop shares, :class:`rlkit.scaffold.LoopSession`::

    with LoopSession(run) as session:          # locks and writes the run dir, seeds the RNGs, opens the service
        trainer = session.open_trainer()       # fresh, train.init_checkpoint, or resumed
        session.restore(data=batcher)          # resumed: loop state + RNG
        for step in session.begin(t, total):   # length, eval/checkpoint cadence, console
            metrics = evaluate(step) if session.eval_due(step) else {}
            ...                                # the algorithm
            session.end_step(step, metrics, session.checkpoint(step + 1, data=batcher))  # line, then checkpoint if due
        return session.finish(lambda: evaluate(total))  # final eval, metrics.png, result.json
                                               # trainer stopped, service closed on every exit path

Its spec names its main held-out metric (``objective``, with its ``direction``): what
``rlkit train -m`` optimises unless ``sweep.objective`` says otherwise.

Adding a loop (rl, dpo, distill) is a ``@loop``-decorated function, a schema dataclass (subclass
:class:`rlkit.config.LoopConfig`) and a recipe YAML in ``configs/recipe/``; a shipped loop's module
is also imported in :func:`import_shipped_loops`. The CLI needs no change. A loop from outside
rlkit is added with :func:`register_loop` (by object, or by ``"module:function"`` strings
resolved when it runs).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, MutableMapping, Optional, Union

from rlkit.loop_registry import REGISTERED, LoopSpec, loop

__all__ = ["LOOPS", "LoopSpec", "get_loop", "import_shipped_loops", "loop", "register_configs", "register_loop"]


def import_shipped_loops() -> None:
    """Import the modules of rlkit's own loops; their ``@loop`` decorators register them."""
    from rlkit.loops import distill, dpo, sft  # noqa: F401 - sft, dpo, onpolicy_distill, offpolicy_distill
    from rlkit.rl import loop as rl_loop, pipeline, task_sft  # noqa: F401 - rl, sft_then_rl, task_sft


class _Loops(MutableMapping[str, LoopSpec]):
    """Every registered loop, the shipped ones imported on first use (:data:`LOOPS`)."""

    def __init__(self) -> None:
        self._imported = False

    def _all(self) -> Dict[str, LoopSpec]:
        if not self._imported:
            import_shipped_loops()
            self._imported = True
        return REGISTERED

    def __getitem__(self, name: str) -> LoopSpec:
        return self._all()[name]

    def __setitem__(self, name: str, spec: LoopSpec) -> None:
        self._all()[name] = spec

    def __delitem__(self, name: str) -> None:
        del self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"LOOPS({dict(self._all())!r})"


#: loop name -> :class:`LoopSpec`: the shipped loops (imported on first use) and any registered since
LOOPS: MutableMapping[str, LoopSpec] = _Loops()


def register_configs() -> None:
    """Store the root, backend and every loop's ``train`` schema in Hydra's ConfigStore
    (idempotent; call again after :func:`register_loop`)."""
    from hydra.core.config_store import ConfigStore

    from rlkit.config import store_base_schemas

    store_base_schemas()
    cs = ConfigStore.instance()
    for name, spec in LOOPS.items():
        cs.store(group="schema/train", name=name, node=spec.schema_class())


def register_loop(name: str, entry: Union[Callable[..., Any], str], schema: Union[type, str], objective: Optional[str] = None,
                  direction: str = "minimize") -> None:
    """Add a loop at run time (a plugin): ``entry`` the function (or ``"module:function"``),
    ``schema`` its ``train`` dataclass (or ``"module:Dataclass"``). rlkit's own loops register
    themselves with ``@loop``."""
    LOOPS[name] = LoopSpec(entry, schema, objective, direction)


def get_loop(name: str) -> LoopSpec:
    from rlkit.errors import ConfigError

    if name not in LOOPS:
        raise ConfigError(f"unknown loop {name!r}; available: {', '.join(sorted(LOOPS))}")
    return LOOPS[name]
