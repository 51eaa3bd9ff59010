"""A verifiers environment whose reward raises on odd tasks: those episodes fail, the run goes on."""

from __future__ import annotations

from typing import Iterator

import verifiers.v1 as vf


class FlakyTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def flaky(self, trace: vf.Trace) -> float:
        if self.data.idx % 2:
            raise RuntimeError("the rubric crashed")
        return float("a" in trace.last_reply)


class FlakyTaskset(vf.Taskset[FlakyTask, vf.TasksetConfig]):
    def load(self) -> Iterator[FlakyTask]:
        for _ in range(8):
            yield FlakyTask(vf.TaskData(prompt="Say a word with the letter a."), self.config.task)


__all__ = ["FlakyTaskset"]


def load_environment() -> vf.Env:
    return vf.load_environment(vf.resolve_env_config({"taskset": {"id": "vf_flaky"}, "agent": {"harness": {"id": "null"}}}))
