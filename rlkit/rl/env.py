"""The RL data model, re-exported from where it is declared (:mod:`rlkit.tasks.base`, below
``rlkit.rl`` so tasks never import the loops): environments, transitions, trajectories."""

from rlkit.tasks.base import Env, EnvGroup, StepResult, Trajectory, TrajectoryGroup, Transition
from rlkit.tasks.single_turn import RewardCallable, SingleTurnEnv, SingleTurnEnvGroup

__all__ = ["Env", "EnvGroup", "RewardCallable", "SingleTurnEnv", "SingleTurnEnvGroup", "StepResult", "Trajectory",
           "TrajectoryGroup", "Transition"]
