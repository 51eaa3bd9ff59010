"""RL tasks: problems + prompt rendering + reward, turned into environment groups.

The protocol is :class:`rlkit.tasks.base.Task` (with :class:`~rlkit.tasks.base.EnvGroup`,
:class:`~rlkit.tasks.base.Env` and the trajectory data model). Built-in tasks: ``arithmetic``
(generated 2-digit problems), ``gsm8k`` (grade-school maths), ``code`` (competitive programming,
multi-turn; see ``rlkit.tasks.code``), ``tools`` (any task, with tools the model may call; see
``rlkit.tasks.tools``), ``reasoning_gym`` (any reasoning-gym dataset; ``rlkit.tasks.reasoning_gym``). A config selects one with ``task.name`` or plugs in a user class with
``task._target_``; :func:`register_task` adds a name.
"""

from rlkit.tasks.base import (
    TASKS,
    Env,
    EnvGroup,
    StepResult,
    Task,
    Trajectory,
    TrajectoryGroup,
    Transition,
    build_task,
    register_task,
)
from rlkit.tasks.single_turn import SingleTurnEnv, SingleTurnEnvGroup

__all__ = ["TASKS", "Env", "EnvGroup", "SingleTurnEnv", "SingleTurnEnvGroup", "StepResult", "Task", "Trajectory",
           "TrajectoryGroup", "Transition", "build_task", "register_task"]
