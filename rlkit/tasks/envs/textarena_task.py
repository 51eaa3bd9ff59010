"""`TextArena <https://github.com/LeonGuertler/TextArena>`_ games as RL tasks, one player or several
(``train.task.name=textarena train.task.env_id=GAME``; needs the ``envs`` extra).

TextArena (Guertler et al. 2025, arXiv:2504.11442) is a collection of text games: single-player
puzzles (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ...) and multi-player games (``TicTacToe-v0``,
...). A game's observation for a player is its whole history so far, so each move is sampled in a
fresh context ``[system?, user: observation]`` (as SPIRAL does: Liu et al. 2025,
arXiv:2506.24119) and trained in the context it was sampled in (:mod:`rlkit.tasks.envs.text`).

**Players.** The trained seat is the problem's ``seat``; every other seat is the ``opponent``:

- ``self`` — **self-play**: the current policy plays the other seats too (its sampling client and
  params, handed to the group by the collector). Problems come in one per seat (``seats``, default
  every seat), so each group holds G games of one seat and trains that seat's turns with that
  seat's reward: groups are formed per seat. The opponent's moves are part of the environment, not
  trained in that group.
- ``base`` — the frozen base model (its sampling client, opened by the RL loop: :meth:`attach`);
- ``checkpoint`` — a frozen checkpoint, ``opponent_checkpoint=PATH`` (a sampler path of this engine);
- ``random`` — a scripted player choosing uniformly among the moves the game lists
  (``Available Moves: '[0]', '[4]'``; checked before the run for the chosen game);
- ``module:function`` — your scripted player, ``function(observation: str, player_id: int) -> str``.

``eval_opponent`` (default: ``base`` under self-play, else the training opponent) is whom the
held-out games are played against, so ``eval/greedy_accuracy`` is the win rate against it.

**Reward** of a seat: the game's own at its end (``env.close()``: +1 win, -1 loss, 0 draw in
two-player games; a puzzle's own score: 1 solved, else a partial score in [0, 1)), 0 if the episode
is cut off by ``train.rollout.max_turns``. **Metrics** on the last turn: ``win`` (a puzzle: solved,
score 1; several players: reward > 0), ``draw``, ``loss``, ``invalid_move`` (the game judged a move
of the trained seat invalid), ``correct`` (= win: what ``eval/greedy_accuracy`` counts), ``turns``.

Games that need network data fail the config check with one line, before any model loads.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from rlkit.errors import ConfigError
from rlkit.tasks.base import Problem, split_problems
from rlkit.tasks.envs.text import ChatPolicy, TextEnv, TextEnvTask, TextTurn

INSTALL = "install the envs extra: pip install 'rlkit[envs]' (or bash scripts/install.sh envs)"
MODEL_OPPONENTS = ("self", "base", "checkpoint")
_MOVES = re.compile(r"(?:Available|Valid) [Mm]oves:?\s*(.*)")
_BRACKETED = re.compile(r"\[[^\[\]]+\]")
MAX_PLAYERS = 8


def _textarena() -> Any:
    try:
        import textarena
    except ImportError:
        raise ConfigError(f"train.task.name=textarena needs the textarena package: {INSTALL}") from None
    return textarena


def listed_moves(observation: str) -> List[str]:
    """The moves the game lists last in ``observation`` (``Available Moves: '[0]', '[4]'``)."""
    lines = _MOVES.findall(observation)
    return _BRACKETED.findall(lines[-1]) if lines else []


def random_player(observation: str, player_id: int, rng: Optional[random.Random] = None) -> str:
    """The scripted ``random`` opponent: a uniform choice among the listed moves."""
    moves = listed_moves(observation)
    if not moves:
        raise ValueError("the random opponent found no 'Available Moves:' list in the observation")
    return (rng or random).choice(moves)


def number_of_players(env_id: str, env_kwargs: Mapping[str, Any]) -> int:
    """How many players ``env_id`` takes (TextArena asserts the count at ``reset``), checked by
    starting one game offline; one ConfigError line for an unknown game or one that cannot start."""
    ta = _textarena()
    from textarena.envs.registration import ENV_REGISTRY

    from rlkit.imports import suggest

    if env_id not in ENV_REGISTRY:
        raise ConfigError(f"train.task.env_id: no TextArena game {env_id!r}{suggest(env_id, ENV_REGISTRY)} "
                          "(the games: textarena.envs.registration.ENV_REGISTRY)")
    last = ""
    for n in range(1, MAX_PLAYERS + 1):
        try:
            env = ta.make(env_id, **env_kwargs)
            env.reset(num_players=n, seed=0)
            env.get_observation()
            return n
        except AssertionError as exc:
            last = str(exc)
        except Exception as exc:  # noqa: BLE001 - e.g. a game whose data must be downloaded
            raise ConfigError(f"train.task.env_id: {env_id} cannot start here ({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); "
                              "choose a game that runs offline") from None
    raise ConfigError(f"train.task.env_id: {env_id} did not start with 1 to {MAX_PLAYERS} players ({last})")


class ArenaGame(TextEnv):
    """One game from the trained ``seat``'s side; ``players[p]`` makes every other seat's moves."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any], num_players: int, seed: int, seat: int,
                 players: Mapping[int, Callable[[str, int], str]]):
        self.env_id, self.env_kwargs, self.num_players = env_id, dict(env_kwargs), num_players
        self.seed, self.seat, self.players = seed, seat, players
        self.env: Any = None
        self.turns = 0
        self.finished = False

    def reset(self) -> TextTurn:
        self.env = _textarena().make(self.env_id, **self.env_kwargs)
        self.env.reset(num_players=self.num_players, seed=self.seed)
        if self._others_play():
            return TextTurn(observation="(the game ended before this seat's turn)")  # a degenerate game: step ends it
        return TextTurn(observation=self.env.get_observation()[1], fresh=True)

    def step(self, reply: str) -> TextTurn:
        if self.finished:
            return self._end()
        self.turns += 1
        done, _ = self.env.step(reply)
        if done or self._others_play():
            return self._end()
        return TextTurn(observation=self.env.get_observation()[1], fresh=True, metrics={"turns": float(self.turns)})

    def _others_play(self) -> bool:
        """Let the other seats move until it is the trained seat's turn; whether the game ended."""
        while True:
            player, observation = self.env.get_observation()
            if player == self.seat:
                return False
            done, _ = self.env.step(self.players[player](observation, player))
            if done:
                self.finished = True
                return True

    def _end(self) -> TextTurn:
        rewards, info = self.env.close()
        self.env = None
        reward = float((rewards or {}).get(self.seat, 0.0))
        own = (info or {}).get(self.seat, {}) if isinstance(info, Mapping) else {}
        # a puzzle is won at its full score, 1: TextArena scores a failed one in [0, 1) (e.g. GuessTheNumber's
        # closeness of the last guess, TowerOfHanoi's share of disks on the target tower); a game of several players at +1
        win = float(reward >= 1.0) if self.num_players == 1 else float(reward > 0)
        draw = float(self.num_players > 1 and rewards is not None and reward == 0)
        loss = 1.0 - win - draw  # a puzzle not solved is lost
        metrics = {"win": win, "draw": draw, "loss": loss, "correct": win, "turns": float(self.turns),
                   "invalid_move": float(bool(own.get("invalid_move", False)))}
        return TextTurn(reward=reward, done=True, metrics=metrics, info={"reason": str(own.get("reason", ""))})

    def close(self) -> None:
        if self.env is not None:
            try:
                self.env.close()
            finally:
                self.env = None


class TextArenaTask(TextEnvTask):
    """A TextArena game, one seat trained (see the module docstring)."""

    name = "textarena"

    def __init__(self, env_id: str = "GuessTheNumber-v0", opponent: str = "self", eval_opponent: Optional[str] = None,
                 opponent_checkpoint: Optional[str] = None, seats: Optional[Sequence[int]] = None,
                 env_kwargs: Optional[Dict[str, Any]] = None, num_train: int = 256, num_test: int = 32, seed: int = 0,
                 system_prompt: Optional[str] = None, reset_timeout_s: float = 60.0):
        super().__init__(num_train=num_train, num_test=num_test, seed=seed, system_prompt=system_prompt,
                         reset_timeout_s=reset_timeout_s)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.num_players = number_of_players(env_id, self.env_kwargs)
        self.opponent = opponent
        self.eval_opponent = eval_opponent or ("base" if opponent == "self" else opponent)
        self.opponent_checkpoint = opponent_checkpoint
        self.seats = list(seats) if seats is not None else list(range(self.num_players))
        self.check_options({"env_id": env_id, "opponent": opponent, "eval_opponent": self.eval_opponent, "seats": self.seats,
                            "opponent_checkpoint": opponent_checkpoint, "env_kwargs": self.env_kwargs}, self.num_players)
        self.scripted = {name: self._scripted(name) for name in {self.opponent, self.eval_opponent} if name not in MODEL_OPPONENTS}
        self.frozen: Dict[str, Any] = {}  # "base" / "checkpoint" -> its sampling client (attach)

    @classmethod
    def check_options(cls, options: Mapping[str, Any], num_players: int = 0) -> None:
        env_id = options.get("env_id", "GuessTheNumber-v0")
        n = num_players or number_of_players(env_id, options.get("env_kwargs") or {})
        opponent = options.get("opponent", "self")
        eval_opponent = options.get("eval_opponent") or ("base" if opponent == "self" else opponent)
        for key, name in (("opponent", opponent), ("eval_opponent", eval_opponent)):
            if name == "checkpoint" and not options.get("opponent_checkpoint"):
                raise ConfigError(f"train.task.{key}=checkpoint needs train.task.opponent_checkpoint=PATH (a sampler path)")
            if name == "random" and n > 1 and not _lists_moves(env_id, options.get("env_kwargs") or {}, n):
                raise ConfigError(f"train.task.{key}=random: {env_id} does not list its moves ('Available Moves: ...'); "
                                  "use a module:function player, base or self")
            if name not in MODEL_OPPONENTS and name != "random":
                from rlkit.imports import import_object

                if not callable(import_object(name, f"train.task.{key}")):
                    raise ConfigError(f"train.task.{key}: {name} is not a function (observation, player_id) -> move")
        seats = options.get("seats")
        if seats is not None and (not seats or any(not 0 <= int(s) < n for s in seats)):
            raise ConfigError(f"train.task.seats={list(seats)}: {env_id} has seats 0..{n - 1}")

    def _scripted(self, name: str) -> Callable[..., str]:
        if name == "random":
            return random_player
        from rlkit.imports import import_object

        return import_object(name, "train.task.opponent")

    def attach(self, service: Any, base_model: str) -> None:
        wanted = {self.opponent, self.eval_opponent} if self.num_players > 1 else set()
        if "base" in wanted:
            self.frozen["base"] = service.create_sampling_client(base_model=base_model)
        if "checkpoint" in wanted:
            self.frozen["checkpoint"] = service.create_sampling_client(model_path=self.opponent_checkpoint)

    def problems(self, split: str) -> List[Dict[str, Any]]:
        seeds = {"train": range(self.seed, self.seed + self.num_train),
                 "test": range(self.seed + self.num_train, self.seed + self.num_train + self.num_test)}
        out = {name: [{"seed": s, "seat": self.seats[i % len(self.seats)], "opponent": self.opponent if name == "train" else self.eval_opponent}
                      for i, s in enumerate(r)] for name, r in seeds.items()}
        return split_problems(self.name, out, split)

    def make_env(self, problem: Problem, policy: Optional[ChatPolicy]) -> ArenaGame:
        seed, seat = int(problem["seed"]), int(problem.get("seat", 0))
        others: Dict[int, Callable[[str, int], str]] = {}
        if self.num_players > 1:
            player = self._player(str(problem.get("opponent", self.opponent)), policy, seed)
            others = {p: player for p in range(self.num_players) if p != seat}
        return ArenaGame(self.env_id, self.env_kwargs, self.num_players, seed, seat, others)

    def _player(self, name: str, policy: Optional[ChatPolicy], seed: int) -> Callable[[str, int], str]:
        if name in self.scripted:
            rng = random.Random(seed)
            fn = self.scripted[name]
            return (lambda obs, pid: fn(obs, pid, rng)) if name == "random" else fn
        model: Optional[ChatPolicy] = policy
        if name != "self":
            frozen = self.frozen.get(name)
            model = ChatPolicy(frozen, policy.tokenizer, policy.params) if frozen is not None and policy is not None else None
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

        def play(observation: str, player_id: int) -> str:
            if model is None:  # fails this episode only (counted), at the opponent's first move
                raise RuntimeError(f"the {name} opponent has no sampler (the RL loop attaches one; the collector hands "
                                   "over the policy's)")
            return model.reply(system + [{"role": "user", "content": observation}])

        return play


def _lists_moves(env_id: str, env_kwargs: Mapping[str, Any], n: int) -> bool:
    env = _textarena().make(env_id, **env_kwargs)
    env.reset(num_players=n, seed=0)
    return bool(listed_moves(env.get_observation()[1]))
