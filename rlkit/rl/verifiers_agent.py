"""``train.task.name=verifiers``: a verifiers environment trained through rlkit's rollout endpoint.

A verifiers episode calls the model itself (its harness's chat loop, through its interception
endpoint), so it trains the way an agent written against the OpenAI client does
(:mod:`rlkit.rl.agents`): each rollout opens an episode on :class:`~rlkit.serve.rollouts.RolloutEndpoint`
(the step's sampling client and the run's sampling settings), the verifiers episode runs with its
model there (:meth:`rlkit.tasks.envs.verifiers_task.VerifiersEnvTask.run`), and the recorded calls
— exact prompt and sampled tokens, logprobs — become the trajectory, scored with the episode's
reward. Everything verifiers-specific (loading, checks, the mapping) is in
:mod:`rlkit.tasks.envs.verifiers_task`; this class only wires it to the agent machinery (which
lives here, above the tasks, beside the endpoint it drives).

Config (``train.task``): ``env`` (``module:function``) or ``env_id``, ``env_args``, ``num_train``,
``num_test``, ``timeout_s`` (per episode), ``max_workers`` (episodes in flight), ``host`` (where
the endpoint listens). See docs/environments.md.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from rlkit.rl.agents import LOOP_GRACE_S, AgentTask
from rlkit.tasks.envs.verifiers_task import VerifiersEnvTask

_ENV_OPTIONS = ("env", "env_id", "env_args", "num_train", "num_test", "timeout_s")


class VerifiersTask(AgentTask):
    """A verifiers environment's tasks; each rollout one verifiers episode through rlkit's rollout endpoint."""

    name = "verifiers"

    def __init__(self, env: Optional[str] = None, env_id: Optional[str] = None, env_args: Optional[Dict[str, Any]] = None,
                 num_train: Optional[int] = None, num_test: int = 0, timeout_s: float = 300.0, max_workers: int = 32,
                 host: str = "127.0.0.1"):
        spec = {"_target_": "rlkit.tasks.envs.verifiers_task:VerifiersEnvTask", "env": env, "env_id": env_id, "env_args": env_args,
                "num_train": num_train, "num_test": num_test, "timeout_s": timeout_s}
        # the episode bounds itself by timeout_s (with a clear line); the agent's own limit is a backstop past it
        super().__init__(agent=self._episode, task=spec, timeout_s=float(timeout_s) + 2 * LOOP_GRACE_S, max_workers=max_workers,
                         host=host)

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        VerifiersEnvTask.check_options({k: v for k, v in options.items() if k in _ENV_OPTIONS})

    def _episode(self, problem: Mapping[str, Any], *, base_url: str, model: str) -> Any:
        return self.inner.run(problem, base_url=base_url, model=model)
