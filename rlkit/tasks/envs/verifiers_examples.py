"""A small verifiers environment shipped with rlkit for recipes, tests and docs (the ``verifiers`` extra).

``load_environment`` (``train.task.env=rlkit.tasks.envs.verifiers_examples:load_environment``)
returns a verifiers 0.4.0 environment of the usual shape — a ``vf.Taskset`` of ``vf.Task`` s with a
``@vf.reward`` and a ``@vf.metric``, played by verifiers' ``null`` chat harness (``SingleAgentEnv``):
each task asks for one word containing a given letter; the reward is 1 when the reply contains it.
A 135M model (or the tests' tiny random one) gets it right sometimes, so GRPO groups have reward
variance.

``load_one_word_environment`` (the ``verifiers_one_word_grpo`` recipe, measured in
cookbook/environments) is the same request held to its word: the reward is 1 only when the reply
*is* one word (three or more letters, surrounding quotes and punctuation ignored) containing the letter.
SmolLM2-135M-Instruct answers in sentences ("The word "O" is a perfect..."), so its base rate is low
and what GRPO has to learn is to follow the instruction. 26 letters x 3 phrasings, shuffled once.

verifiers' loader names a taskset by a top-level module name (``vf eval my_taskset``); this module
also answers to :data:`TASKSET_ID` so it can live inside rlkit's package.
"""

from __future__ import annotations

import random
import re
import sys
import types
from typing import Iterator

import verifiers.v1 as vf

TASKSET_ID = "rlkit_verifiers_letters"
ONE_WORD_ID = "rlkit_verifiers_one_word"
LETTERS = "aeiostnrl"
PHRASINGS = ("Write one word that contains the letter {letter}.", "Give a single word with the letter {letter} in it.",
             "Name one word containing the letter {letter}.")
_WORD = re.compile(r"[a-z]+")


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


def one_word(reply: str) -> str:
    """The reply's one word, lowercased (surrounding whitespace, quotes and punctuation ignored), or
    ``""`` when the reply is not exactly one word of three or more letters."""
    word = reply.strip().strip("\"'.,!?*`()[]").lower()
    return word if len(word) >= 3 and _WORD.fullmatch(word) else ""


class OneWordTask(vf.Task[LetterData]):
    @vf.reward
    async def one_word_with_letter(self, trace: vf.Trace) -> float:
        """1 when the reply is one word of letters that contains the task's letter."""
        return float(self.data.letter in one_word(trace.last_reply))

    @vf.metric
    async def is_one_word(self, trace: vf.Trace) -> float:
        return float(bool(one_word(trace.last_reply)))


class OneWordConfig(vf.TasksetConfig):
    seed: int = 0


class OneWordTaskset(vf.Taskset[OneWordTask, OneWordConfig]):
    def load(self) -> Iterator[OneWordTask]:
        pairs = [(letter, phrasing) for letter in "abcdefghijklmnopqrstuvwxyz" for phrasing in PHRASINGS]
        random.Random(self.config.seed).shuffle(pairs)
        for letter, phrasing in pairs:
            yield OneWordTask(LetterData(prompt=phrasing.format(letter=letter), letter=letter,
                                         system_prompt="Reply with one word."), self.config.task)


__all__ = ["LetterTaskset"]
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
_one_word = types.ModuleType(ONE_WORD_ID, "the one-word taskset alone, under the id verifiers' loader imports")
_one_word.OneWordTaskset = OneWordTaskset  # type: ignore[attr-defined]
_one_word.__all__ = ["OneWordTaskset"]
sys.modules.setdefault(ONE_WORD_ID, _one_word)


def load_environment(num_tasks: int = 64, harness: str = "null") -> vf.Env:
    """The letter taskset as a verifiers environment, its one seat on ``harness`` (``null``: the plain chat loop)."""
    return _environment({"id": TASKSET_ID, "num_tasks": num_tasks}, harness)


def load_one_word_environment(seed: int = 0, harness: str = "null") -> vf.Env:
    """The one-word taskset (78 tasks: 26 letters x 3 phrasings, order by ``seed``) as a verifiers environment."""
    return _environment({"id": ONE_WORD_ID, "seed": seed}, harness)


def _environment(taskset: dict, harness: str) -> vf.Env:
    """A taskset (its config, ``id`` naming it) with its one seat on verifiers' ``harness``."""
    return vf.load_environment(vf.resolve_env_config({"taskset": taskset, "agent": {"harness": {"id": harness}}}))
