"""A small verifiers environment shipped with rlkit for recipes, tests and docs (the ``verifiers`` extra).

``load_environment`` (``train.task.env=rlkit.tasks.envs.verifiers_examples:load_environment``)
returns a verifiers 0.4.0 environment of the usual shape — a ``vf.Taskset`` of ``vf.Task`` s with a
``@vf.reward`` and a ``@vf.metric``, played by verifiers' ``null`` chat harness (``SingleAgentEnv``):
each task asks for one word containing a given letter; the reward is 1 when the reply contains it.
A 135M model (or the tests' tiny random one) gets it right sometimes, so GRPO groups have reward
variance.

verifiers' loader names a taskset by a top-level module name (``vf eval my_taskset``); this module
also answers to :data:`TASKSET_ID` so it can live inside rlkit's package.
"""

from __future__ import annotations

import sys
from typing import Iterator

import verifiers.v1 as vf

TASKSET_ID = "rlkit_verifiers_letters"
LETTERS = "aeiostnrl"


class LetterData(vf.TaskData):
    letter: str


class LetterTask(vf.Task[LetterData]):
    @vf.reward
    async def has_letter(self, trace: vf.Trace) -> float:
        """1 when the reply contains the task's letter."""
        return float(self.data.letter in trace.last_reply.lower())

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class LetterConfig(vf.TasksetConfig):
    num_tasks: int = 64


class LetterTaskset(vf.Taskset[LetterTask, LetterConfig]):
    def load(self) -> Iterator[LetterTask]:
        for i in range(self.config.num_tasks):
            letter = LETTERS[i % len(LETTERS)]
            yield LetterTask(LetterData(prompt=f"Write one word that contains the letter {letter}.", letter=letter,
                                        system_prompt="Reply with one word."), self.config.task)


__all__ = ["LetterTaskset"]
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])


def load_environment(num_tasks: int = 64, harness: str = "null") -> vf.Env:
    """The letter taskset as a verifiers environment, its one seat on ``harness`` (``null``: the plain chat loop)."""
    return vf.load_environment(vf.resolve_env_config({"taskset": {"id": TASKSET_ID, "num_tasks": num_tasks},
                                                      "agent": {"harness": {"id": harness}}}))
