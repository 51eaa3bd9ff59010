"""OpenEnv environments written for the tests, as a user would write them (the working directory
importable: the tests run rlkit from tests/envs)."""

from __future__ import annotations

import time
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from rlkit.tasks.envs.examples import GuessAction, GuessNumber, GuessObservation


class WordAction(Action):
    word: str = ""


class WordObservation(Observation):
    text: str = ""


class EchoWord(Environment[WordAction, WordObservation, State]):
    """One turn: reward 1 when the reply contains the letter 'a' (the tiny random model's replies
    vary, so groups have reward variance)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> WordObservation:
        return WordObservation(text="Say a word with the letter a.")

    def step(self, action: WordAction, timeout_s: Optional[float] = None, **kwargs: Any) -> WordObservation:
        return WordObservation(done=True, reward=float("a" in action.word))

    @property
    def state(self) -> State:
        return self._state


class FlakyGuess(GuessNumber):
    """Episodes on odd seeds crash at their first step, on seeds = 2 mod 4 hang: they fail, the run goes on."""

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.seed = seed or 0
        return super().reset(seed, episode_id, **kwargs)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        if self.seed % 2:
            raise RuntimeError("the environment crashed")
        if self.seed % 4 == 2:
            time.sleep(4)
        return super().step(action, timeout_s)


class NotAnEnv:
    pass


def broken_parser(reply, schema):
    """A parser with a bug: every reply raises (not ValueError)."""
    return {"guess": reply["value"]}


def picky_parser(reply, schema):
    """A working parser: digits only, else the reply does not parse."""
    if not reply.strip().isdigit():
        raise ValueError("digits only")
    return {"guess": int(reply)}
