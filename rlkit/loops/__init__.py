"""The loops, and the registry the CLI dispatches through.

A recipe names its loop (``loop: sft``); :data:`LOOPS` maps that name to the function that runs
it and the dataclass that types its ``train`` section::

    LOOPS = {"sft": LoopSpec("rlkit.loops.sft:train_sft", "rlkit.config:SFTConfig")}

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

Adding a loop (rl, dpo, distill) is one entry here, a schema dataclass (subclass
:class:`rlkit.config.LoopConfig`) and a recipe YAML in ``configs/recipe/``; the CLI needs no
change. Strings keep ``import rlkit.loops`` cheap: nothing is imported until a loop runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional


@dataclass(frozen=True)
class LoopSpec:
    entry: str  # "module:function", called as fn(cfg, run)
    schema: str  # "module:Dataclass" typing the recipe's ``train`` section
    objective: Optional[str] = None  # its main held-out metric: what a sweep optimises by default
    direction: str = "minimize"  # of ``objective``: minimize | maximize

    def function(self) -> Callable[..., Any]:
        from rlkit.config import import_string

        return import_string(self.entry)

    def schema_class(self) -> type:
        from rlkit.config import import_string

        return import_string(self.schema)


LOOPS: Dict[str, LoopSpec] = {
    "sft": LoopSpec("rlkit.loops.sft:train_sft", "rlkit.config:SFTConfig", "eval/nll", "minimize"),
    "rl": LoopSpec("rlkit.rl.loop:train_rl", "rlkit.rl.config:RLConfig", "eval/greedy_accuracy", "maximize"),
    "dpo": LoopSpec("rlkit.loops.dpo:train_dpo", "rlkit.loops.dpo:DPOConfig", "eval/loss", "minimize"),
    "onpolicy_distill": LoopSpec(
        "rlkit.loops.distill:train_onpolicy_distill", "rlkit.loops.distill:OnPolicyDistillConfig", "eval/reverse_kl", "minimize"
    ),
    "offpolicy_distill": LoopSpec(
        "rlkit.loops.distill:train_offpolicy_distill", "rlkit.loops.distill:OffPolicyDistillConfig", "eval/reverse_kl", "minimize"
    ),
    "task_sft": LoopSpec("rlkit.rl.task_sft:train_task_sft", "rlkit.rl.config:RLConfig", "eval/greedy_accuracy", "maximize"),
    "sft_then_rl": LoopSpec("rlkit.rl.pipeline:train_sft_then_rl", "rlkit.rl.pipeline:SFTThenRLConfig",
                            "rl/eval/greedy_accuracy", "maximize"),
}


def register_configs() -> None:
    """Store the root, backend and every loop's ``train`` schema in Hydra's ConfigStore
    (idempotent; call again after :func:`register_loop`)."""
    from hydra.core.config_store import ConfigStore

    from rlkit.config import store_base_schemas

    store_base_schemas()
    cs = ConfigStore.instance()
    for name, spec in LOOPS.items():
        cs.store(group="schema/train", name=name, node=spec.schema_class())


def register_loop(name: str, entry: str, schema: str, objective: Optional[str] = None, direction: str = "minimize") -> None:
    """Add a loop at run time (a plugin); built-in loops are listed in :data:`LOOPS` directly."""
    LOOPS[name] = LoopSpec(entry, schema, objective, direction)


def get_loop(name: str) -> LoopSpec:
    from rlkit.errors import ConfigError

    if name not in LOOPS:
        raise ConfigError(f"unknown loop {name!r}; available: {', '.join(sorted(LOOPS))}")
    return LOOPS[name]
