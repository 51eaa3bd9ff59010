"""Composable loss modules (see ``docs/losses.md`` for the table of formulas and papers).

    from rlkit.losses import PPO, KLPenalty, run_loss
    loss = PPO(clip_high_threshold=1.28) + 0.01 * KLPenalty()
    run_loss(trainer, batch, loss, aggregation="token_mean").result()
"""

from rlkit.losses.aggregation import AGGREGATIONS, Aggregated, aggregate_direct, compile_weights
from rlkit.losses.base import CompositeLoss, Loss, batch_input, datum_input, validate_inputs
from rlkit.losses.builtin import BUILTIN_LOSSES, LossFunction, builtin_loss
from rlkit.losses.cispo import CISPO
from rlkit.losses.cross_entropy import CrossEntropy
from rlkit.losses.distillation import ReverseKLDistillation
from rlkit.losses.dpo import DPO
from rlkit.losses.execute import run_loss, weighted_nll
from rlkit.losses.gspo import GSPO
from rlkit.losses.importance_sampling import ImportanceSampling
from rlkit.losses.kl import KLPenalty
from rlkit.losses.ppo import PPO
from rlkit.losses.registry import LOSSES, build_loss, register_loss

__all__ = [
    "AGGREGATIONS",
    "Aggregated",
    "BUILTIN_LOSSES",
    "CISPO",
    "CompositeLoss",
    "CrossEntropy",
    "DPO",
    "GSPO",
    "ImportanceSampling",
    "KLPenalty",
    "LOSSES",
    "LossFunction",
    "Loss",
    "PPO",
    "ReverseKLDistillation",
    "aggregate_direct",
    "batch_input",
    "build_loss",
    "builtin_loss",
    "compile_weights",
    "datum_input",
    "register_loss",
    "run_loss",
    "validate_inputs",
    "weighted_nll",
]
