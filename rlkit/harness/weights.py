"""Which weights an evaluation runs on: a base model, a checkpoint, or a training run's newest checkpoint.

``model=NAME`` alone is the base model (an rlkit name such as ``smollm2-135m-instruct`` or ``tiny``,
a Hugging Face directory or hub id). ``checkpoint=DIR`` (or a ``local://`` id; another engine's
id such as ``tinker://...`` or a model-package ARN passes through) is a saved LoRA or full
fine-tuning checkpoint, its base model read from its own metadata. ``run=DIR`` is a directory
``rlkit train`` wrote: its newest checkpoint, the one ``rlkit serve --follow`` would serve (the same
helpers: :func:`rlkit.serve.sources.read_checkpoint_records`, :func:`~rlkit.serve.sources.run_base_model`
and :func:`~rlkit.serve.sources.servable_problem`, so a checkpoint whose files fail their checksums
or hold NaN is skipped, as the server skips it), or its base model before the first checkpoint.

Everything here reads metadata only, so ``rlkit eval`` refuses a wrong checkpoint in one line
before any model loads; naming a ``model=`` that is not the checkpoint's base is such an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlkit.errors import CheckpointCorruptError, ConfigError

#: ``rlkit eval``'s own keys; any other key is a model argument (lm-eval's or the engine's)
EVAL_KEYS = {"tasks", "limit", "num_fewshot", "output", "apply_chat_template", "fewshot_as_multiturn",
             "system_instruction", "gen_kwargs", "seed", "local_data", "include_path", "log_samples",
             "bootstrap_iters", "verbose"}
#: the keys that choose the weights (this module) and the engine
WEIGHT_KEYS = {"model", "checkpoint", "run", "backend"}

log = logging.getLogger("rlkit.harness")

LOCAL_SCHEME = "local://"


@dataclass(frozen=True)
class Weights:
    """What to sample from: ``base_model``, plus ``checkpoint`` (an engine's checkpoint id; ``""``
    for the base model's own weights) and the training step it was saved at, where known."""

    base_model: str
    checkpoint: str = ""
    step: Optional[int] = None
    run_dir: Optional[Path] = None

    def describe(self) -> str:
        if not self.checkpoint:
            return f"base model {self.base_model}"
        step = f" (step {self.step})" if self.step is not None else ""
        return f"checkpoint {self.checkpoint}{step} of {self.base_model}"


def _same_model(a: str, b: str) -> bool:
    from rlkit.backends.local.models import canonical_name

    return canonical_name(a) == canonical_name(b)


def _checkpoint_id(checkpoint: str) -> str:
    """``local://`` ids and other engines' ids as given; a directory becomes its ``local://`` id."""
    if "://" in checkpoint or checkpoint.startswith("arn:"):
        return checkpoint
    from rlkit.backends.local.checkpoints import checkpoint_id

    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise ConfigError(f"checkpoint={checkpoint}: no such directory")
    return checkpoint_id(path)


def _local_checkpoint(checkpoint: str, model: Optional[str]) -> Weights:
    from rlkit.backends.local.checkpoints import read_meta
    from rlkit.serve.sources import servable_problem

    meta = read_meta(checkpoint)  # CheckpointNotFoundError / CheckpointCorruptError: one line
    base = str(meta.get("base_model") or "")
    if model and base and not _same_model(model, base):
        raise ConfigError(f"checkpoint {checkpoint} was trained on base model {base!r}, not model={model!r}: "
                          f"drop model= (the checkpoint names its base) or pass the checkpoint of a {model} run")
    problem = servable_problem(checkpoint)
    if problem:
        raise CheckpointCorruptError(f"{problem}; not evaluating it", checkpoint=checkpoint)
    return Weights(base_model=base or str(model), checkpoint=checkpoint, step=meta.get("step"))


def _run_weights(run: str, model: Optional[str]) -> Weights:
    from rlkit.serve.sources import read_checkpoint_records, run_base_model, servable_problem

    run_dir = Path(run).expanduser().resolve()
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"run={run}: not an rlkit run directory (no config.yaml)")
    base = run_base_model(run_dir)
    if model and not _same_model(model, base):
        raise ConfigError(f"run {run} trains base model {base!r}, not model={model!r}: drop model= or pass another run")
    for record in reversed(read_checkpoint_records(run_dir)):
        checkpoint = str(record.get("checkpoint", ""))
        problem = servable_problem(checkpoint) if checkpoint else "no checkpoint id"
        if problem is None:
            return Weights(base_model=base, checkpoint=checkpoint, step=record.get("step"), run_dir=run_dir)
        log.warning("not evaluating step %s of %s: %s", record.get("step"), run_dir, problem)
    log.warning("run %s has no usable checkpoint yet: evaluating its base model %s", run_dir, base)
    return Weights(base_model=base, run_dir=run_dir)


def resolve_weights(model: Optional[str] = None, checkpoint: Optional[str] = None, run: Optional[str] = None) -> Weights:
    """The :class:`Weights` that ``model=`` / ``checkpoint=`` / ``run=`` name (metadata only; nothing loads).

    At most one of ``checkpoint`` and ``run``; ``model`` with either must be their base model."""
    if checkpoint and run:
        raise ConfigError("give checkpoint= or run=, not both")
    if run:
        return _run_weights(str(run), model)
    if checkpoint:
        ckpt = _checkpoint_id(str(checkpoint))
        if ckpt.startswith(LOCAL_SCHEME):
            return _local_checkpoint(ckpt, model)
        if not model:
            raise ConfigError(f"checkpoint={checkpoint}: another engine's checkpoint; name its base with model=")
        return Weights(base_model=str(model), checkpoint=ckpt)
    return Weights(base_model=str(model or "smollm2-135m-instruct"))
