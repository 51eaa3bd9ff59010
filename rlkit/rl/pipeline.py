"""SFT, then RL from its checkpoint, in one run (``loop: sft_then_rl``): what a practitioner runs.

Two stages, each a complete run directory of its own inside this one::

    RUN_DIR/sft/   loop task_sft: cross-entropy on the task's reference answers (train.sft.steps,
                   train.sft.learning_rate; everything else as in train)
    RUN_DIR/rl/    loop rl from the SFT stage's last checkpoint (train.init_checkpoint), with
                   the rest of train as given

The stages are the ordinary loops (:func:`rlkit.rl.task_sft.train_task_sft`,
:func:`rlkit.rl.loop.train_rl`), so each stage resumes as they do: a run killed anywhere is
continued by rerunning the same command (a finished SFT stage is not trained again). This run's
own ``metrics.jsonl`` gets one line per stage boundary: the held-out metrics before SFT, after
SFT (= before RL) and after RL, prefixed ``sft/`` and ``rl/``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from rlkit.errors import ConfigError
from rlkit.loop_registry import loop
from rlkit.rl.config import RLConfig
from rlkit.runs import Run, last_checkpoint


@dataclass
class SFTStageConfig:
    steps: int = 30
    learning_rate: Optional[float] = None  # null = train.learning_rate


@dataclass
class SFTThenRLConfig(RLConfig):
    """An RL recipe's train section, plus the SFT stage that runs first."""

    sft: SFTStageConfig = field(default_factory=SFTStageConfig)

    def check(self) -> None:
        super().check()
        if self.sft.steps < 1:
            raise ConfigError(f"config key 'train.sft.steps': {self.sft.steps!r} must be a positive integer")
        if self.sft.learning_rate is not None and not self.sft.learning_rate > 0:
            raise ConfigError(f"config key 'train.sft.learning_rate': {self.sft.learning_rate!r} must be > 0")


def stage_config(cfg: Any, loop: str, **train: Any) -> Any:
    """The parent config as a ``loop`` run: ``train`` typed by :class:`RLConfig`, values replaced."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    section = {k: v for k, v in plain["train"].items() if k != "sft"}
    section.update({k: v for k, v in train.items() if v is not None})
    plain.update({"loop": loop, "train": section})
    child = OmegaConf.create(copy.deepcopy(plain))
    child.train = OmegaConf.merge(OmegaConf.structured(RLConfig), section)
    return child


@loop("sft_then_rl", schema=SFTThenRLConfig, objective="rl/eval/greedy_accuracy", direction="maximize")
def train_sft_then_rl(cfg: Any, run: Run) -> Dict[str, Any]:
    """SFT, then RL from its last checkpoint; see the module docstring."""
    from omegaconf import OmegaConf

    from rlkit.rl.loop import train_rl
    from rlkit.rl.task_sft import train_task_sft

    t: SFTThenRLConfig = OmegaConf.to_object(cfg.train)
    sft_cfg = stage_config(cfg, "task_sft", steps=t.sft.steps, learning_rate=t.sft.learning_rate)
    run.materialize()  # lock this run directory before the stages write into it

    with Run.open(sft_cfg, run.dir / "sft") as sft_run:
        sft = train_task_sft(sft_cfg, sft_run)
        sft_metrics = sft_run.metrics()
    rl_cfg = stage_config(cfg, "rl", init_checkpoint=last_checkpoint(run.dir / "sft", purpose="in its SFT stage"))
    with Run.open(rl_cfg, run.dir / "rl") as rl_run:
        rl = train_rl(rl_cfg, rl_run)

    evals = [m for m in sft_metrics if "eval/greedy_accuracy" in m]
    before = {f"sft/{k}": v for k, v in (evals[0] if evals else {}).items() if k.startswith("eval/")}
    run.start(3, title=f"sft_then_rl {cfg.get('recipe')}")
    run.log(0, before)
    run.log(1, {f"sft/{k}": v for k, v in sft.items() if k.startswith(("eval/", "train/"))})
    run.log(2, {f"rl/{k}": v for k, v in rl.items() if k.startswith(("eval/", "reward/"))})
    last = run.finish(plot_keys=("sft/eval/greedy_accuracy", "rl/eval/greedy_accuracy"))
    key = "eval/greedy_accuracy"
    if f"sft/{key}" in before and key in sft and key in rl:
        print(f"{cfg.get('recipe')}: held-out greedy accuracy {before[f'sft/{key}']:.3f} -> {sft[key]:.3f} after SFT "
              f"-> {rl[key]:.3f} after RL; run dir {run.dir}", flush=True)
    return last
