"""Composable loss modules (see ``docs/losses.md`` for the table of formulas and papers)."""

from rlkit.losses.base import CompositeLoss, Loss, batch_input, datum_input, validate_inputs
from rlkit.losses.builtin import BUILTIN_LOSSES, builtin_loss
from rlkit.losses.cispo import CISPO
from rlkit.losses.cross_entropy import CrossEntropy
from rlkit.losses.importance_sampling import ImportanceSampling
from rlkit.losses.ppo import PPO

__all__ = [
    "BUILTIN_LOSSES",
    "CISPO",
    "CompositeLoss",
    "CrossEntropy",
    "ImportanceSampling",
    "Loss",
    "PPO",
    "batch_input",
    "builtin_loss",
    "datum_input",
    "validate_inputs",
]
