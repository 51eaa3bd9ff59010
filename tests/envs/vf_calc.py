"""A verifiers environment with a tool, written for the tests: a vf.Toolset (MCP server, started by
verifiers as `python -m vf_calc` in the rollout's folder) offers `add`; the task's @vf.reward checks
the sum in the reply."""

from __future__ import annotations

from typing import Iterator, List

import verifiers.v1 as vf


class CalcTools(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class CalcData(vf.TaskData):
    answer: int


class CalcTask(vf.Task[CalcData]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(str(self.data.answer) in trace.last_reply)


class CalcConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    @classmethod
    def toolsets(cls, config: CalcConfig) -> List[vf.Toolset]:
        return [CalcTools(config.tools)]

    def load(self) -> Iterator[CalcTask]:
        for i in range(12):
            yield CalcTask(CalcData(prompt=f"What is {i} + 3? Use the add tool.", answer=i + 3), self.config.task)


__all__ = ["CalcTaskset"]


def load_environment() -> vf.Env:
    return vf.load_environment(vf.resolve_env_config({"taskset": {"id": "vf_calc"}, "agent": {"harness": {"id": "null"}}}))


if __name__ == "__main__":
    CalcTools.run()
