"""TextArena games (rlkit/tasks/envs/textarena_task.py): one player, two players in self-play or
against a fixed opponent; win/draw/loss and invalid-move metrics; bad input before any model loads."""

from __future__ import annotations

import json

import pytest

from rlkit import cli
from rlkit.errors import ConfigError
from rlkit.tasks import build_task
from rlkit.tasks.envs.textarena_task import ArenaGame, listed_moves, number_of_players


def exit_code(argv):
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


def test_players_are_counted_by_starting_the_game():
    assert number_of_players("TicTacToe-v0", {}) == 2
    assert number_of_players("GuessTheNumber-v0", {}) == 1
    with pytest.raises(ConfigError, match="no TextArena game 'TicTacToe-v9'.*TicTacToe-v0"):
        number_of_players("TicTacToe-v9", {})


def scripted(moves):
    moves = list(moves)
    return lambda observation, player: moves.pop(0)


def test_a_seat_wins_loses_or_draws_with_the_games_own_reward():
    # seat 0 plays 0, 1, 2 (top row); seat 1 (scripted) plays 3, 4: seat 0 wins on its third move
    game = ArenaGame("TicTacToe-v0", {}, 2, seed=0, seat=0, players={1: scripted(["[3]", "[4]"])})
    assert "Available Moves" in game.reset().observation
    assert game.step("[0]").fresh and not game.step("[1]").done
    end = game.step("[2]")
    assert (end.done, end.reward) == (True, 1.0)
    assert {k: end.metrics[k] for k in ("win", "loss", "draw", "correct", "invalid_move")} == \
        {"win": 1.0, "loss": 0.0, "draw": 0.0, "correct": 1.0, "invalid_move": 0.0}
    # the same game from seat 1's side: seat 0 is scripted and moves first; seat 1 loses
    game = ArenaGame("TicTacToe-v0", {}, 2, seed=0, seat=1, players={0: scripted(["[0]", "[1]", "[2]"])})
    assert "Player 1" in game.reset().observation
    game.step("[3]")
    end = game.step("[4]")
    assert (end.done, end.reward, end.metrics["loss"]) == (True, -1.0, 1.0)


def test_invalid_moves_are_counted():
    game = ArenaGame("TicTacToe-v0", {}, 2, seed=0, seat=0, players={1: scripted(["[4]"] * 5)})
    game.reset()
    turn = game.step("no move")  # TextArena allows one retry...
    assert not turn.done and "resubmit" in turn.observation
    end = game.step("still none")  # ...then the game is lost
    assert (end.done, end.reward, end.metrics["invalid_move"]) == (True, -1.0, 1.0)


def test_a_puzzle_is_won_only_when_solved_not_for_its_partial_score():
    """GuessTheNumber-v0 scores a failed game by how close the last guess was (in [0, 1)): that is its
    reward, but the game is lost; solving it scores 1 and wins."""
    game = ArenaGame("GuessTheNumber-v0", {}, 1, seed=0, seat=0, players={})
    game.reset()
    target = game.env.state.game_state["game_number"]
    wrong = 1 if target != 1 else 2
    end = game.step(f"[{wrong}]")
    for _ in range(3):  # the same guess again is invalid: after TextArena's retry, the game ends with a partial score
        if not end.done:
            end = game.step(f"[{wrong}]")
    assert end.done and 0.0 < end.reward < 1.0, end.reward
    assert {k: end.metrics[k] for k in ("win", "loss", "correct", "invalid_move")} == \
        {"win": 0.0, "loss": 1.0, "correct": 0.0, "invalid_move": 1.0}
    game = ArenaGame("GuessTheNumber-v0", {}, 1, seed=0, seat=0, players={})
    game.reset()
    end = game.step(f"[{game.env.state.game_state['game_number']}]")
    assert (end.done, end.reward, end.metrics["win"], end.metrics["loss"]) == (True, 1.0, 1.0, 0.0)


def test_listed_moves_and_the_random_opponent():
    assert listed_moves("Board\nAvailable Moves: '[0]', '[4]', '[8]'") == ["[0]", "[4]", "[8]"]
    task = build_task({"name": "textarena", "env_id": "TicTacToe-v0", "opponent": "random", "num_train": 2, "num_test": 0})
    game = task.make_env({"seed": 1, "seat": 1, "opponent": "random"}, None)
    first = game.reset().observation
    assert "Player 1" in first and first.count("O") >= 2  # the random seat 0 already moved


def test_self_play_problems_alternate_seats_and_held_out_games_face_the_frozen_base():
    task = build_task({"name": "textarena", "env_id": "TicTacToe-v0", "num_train": 4, "num_test": 2})
    assert [(p["seat"], p["opponent"]) for p in task.problems("train")] == [(0, "self"), (1, "self")] * 2
    assert [p["opponent"] for p in task.problems("test")] == ["base", "base"]
    solo = build_task({"name": "textarena", "env_id": "GuessTheNumber-v0", "num_train": 2, "num_test": 1})
    assert solo.num_players == 1 and [p["seat"] for p in solo.problems("train")] == [0, 0]


def test_in_self_play_the_policy_makes_the_other_seats_moves(service):
    """A group's opponent is the sampling client the collector hands over: seat 0 is scripted here
    (the trained seat's replies), seat 1's moves come from the tiny policy."""
    from rlkit.backends.local.models import load_tokenizer
    from rlkit.tasks.envs.text import ChatPolicy
    from rlkit.types import SamplingParams

    sampler = service.create_sampling_client(base_model="tiny")
    calls = []

    class Counting:
        def sample(self, *args, **kwargs):
            calls.append(kwargs["sampling_params"].seed)
            return sampler.sample(*args, **kwargs)

    task = build_task({"name": "textarena", "env_id": "TicTacToe-v0", "num_train": 2, "num_test": 0})
    policy = ChatPolicy(Counting(), load_tokenizer("tiny"), SamplingParams(max_tokens=4, temperature=1.0, seed=7))
    game = task.make_env({"seed": 0, "seat": 0, "opponent": "self"}, policy)
    game.reset()
    turn = game.step("[4]")
    assert len(calls) >= 1 and len(set(calls)) == len(calls)  # each opponent move its own seed
    assert turn.done or "[4]" not in listed_moves(turn.observation)


@pytest.mark.parametrize("overrides, expected", [
    (["train.task.env_id=TicTacToe-v9"], "no TextArena game 'TicTacToe-v9'"),
    (["train.task.opponent=checkpoint"], "train.task.opponent=checkpoint needs train.task.opponent_checkpoint=PATH"),
    (["+train.task.seats=[2]"], "train.task.seats=[2]: TicTacToe-v0 has seats 0..1"),
    (["train.task.opponent=no_module:play"], "no_module"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, overrides, expected):
    run = tmp_path / "run"
    assert exit_code(["train", "recipe=textarena_grpo_smoke", *overrides, f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not run.exists()


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [[], ["train.task.env_id=GuessTheNumber-v0"]])
def test_self_play_and_a_puzzle_train_through_rlkit_train(tmp_path, overrides):
    run = tmp_path / "run"
    assert cli.main(["train", "recipe=textarena_grpo_smoke", *overrides, "logger.console=false", f"run_dir={run}"]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "reward/mean" in m]
    assert len(steps) == 2 and all(m["tokens/sampled"] > 0 for m in steps)
    assert all(k in lines[0] for k in ("eval/greedy/win", "eval/greedy/loss", "eval/greedy/invalid_move"))
    assert all(abs(m["reward/win"] + m["reward/draw"] + m["reward/loss"] - 1.0) < 1e-9 for m in steps if "reward/win" in m)
