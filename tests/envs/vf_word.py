"""A single-turn verifiers environment written for the tests, as a user would write one (verifiers
0.4.0: a vf.Taskset of vf.Tasks with weighted @vf.reward s and a @vf.metric, played by the null
chat harness), plus the bad inputs the tests feed ``train.task.env``. The working directory (or
sys.path) must hold this module: verifiers names a taskset by its top-level module."""

from __future__ import annotations

from typing import Iterator

import verifiers.v1 as vf


class WordData(vf.TaskData):
    letter: str


class WordTask(vf.Task[WordData]):
    @vf.reward
    async def has_letter(self, trace: vf.Trace) -> float:
        return float(self.data.letter in trace.last_reply.lower())

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()) <= 2)

    @vf.metric
    async def words(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()))


class WordTaskset(vf.Taskset[WordTask, vf.TasksetConfig]):
    def load(self) -> Iterator[WordTask]:
        for i in range(12):
            letter = "aeo"[i % 3]
            yield WordTask(WordData(prompt=f"Say a word with the letter {letter}.", system_prompt="Answer in one word.",
                                    letter=letter), self.config.task)


__all__ = ["WordTaskset"]


def load_environment(harness: str = "null") -> vf.Env:
    return vf.load_environment(vf.resolve_env_config({"taskset": {"id": "vf_word"}, "agent": {"harness": {"id": harness}}}))


ENV = load_environment()  # an environment as a module attribute works too


# -- bad inputs -------------------------------------------------------------------------------------

NOT_CALLABLE = 3


def not_an_env():
    return {"taskset": "vf_word"}


def a_taskset():
    return WordTaskset(vf.TasksetConfig(id="vf_word"))


def raising():
    raise ValueError("no such dataset")


def codex():
    return load_environment(harness="codex")
