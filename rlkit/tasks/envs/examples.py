"""Small OpenEnv environments shipped with rlkit for recipes, tests and docs (the ``envs`` extra).

``GuessNumber`` (``rlkit.tasks.envs.examples:GuessNumber``): guess a number from 1 to 9 in at most
3 tries with "higher"/"lower" hints; reward 1 for the right guess, 0 otherwise — a multi-turn game
a 135M model plays a little better than chance, so GRPO groups have reward variance.
"""

from __future__ import annotations

import random
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: int = 0


class GuessObservation(Observation):
    prompt: str = ""


class GuessNumber(Environment[GuessAction, GuessObservation, State]):
    """Guess a number from 1 to ``high`` in at most ``tries`` tries (see the module docstring)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    high = 9
    tries = 3

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.target = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self.target = random.Random(seed).randint(1, self.high)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt=f"Guess my number from 1 to {self.high}. You have {self.tries} tries. "
                                       "Reply with the number only.")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        if action.guess == self.target:
            return GuessObservation(prompt="Correct!", done=True, reward=1.0)
        hint = "higher" if action.guess < self.target else "lower"
        return GuessObservation(prompt=f"No, my number is {hint}. Guess again.", done=self._state.step_count >= self.tries,
                                reward=0.0)

    @property
    def state(self) -> State:
        return self._state
