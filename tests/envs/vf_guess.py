"""A multi-turn verifiers environment written for the tests: the env (vf.Env.run) answers each
guess "Higher." / "Lower." through the seat's interaction until the number is found or the tries
run out; the task's @vf.reward reads what the env recorded."""

from __future__ import annotations

import re
from typing import Iterator

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    target: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward
    async def solved(self, trace: vf.Trace) -> float:
        return float(bool(trace.info.get("solved")))


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self) -> Iterator[GuessTask]:
        for i in range(12):
            yield GuessTask(GuessData(prompt="Guess my number from 1 to 9. Reply with the number only.", target=i % 9 + 1),
                            self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    tries: int = 3


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents) -> None:
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            for turn in range(1, self.config.tries + 1):
                if segment.terminated:
                    break
                numbers = re.findall(r"\d+", segment.last_reply)
                guess = int(numbers[-1]) if numbers else None
                if guess == task.data.target:
                    interaction.trace.info["solved"] = True
                    break
                if turn == self.config.tries:
                    break
                segment = await interaction.turn("Higher." if guess is None or guess < task.data.target else "Lower.")


__all__ = ["GuessTaskset", "GuessEnv"]


def load_environment() -> vf.Env:
    return vf.load_environment(vf.resolve_env_config({"taskset": {"id": "vf_guess"}}))
