"""OpenEnv environments train unchanged (rlkit/tasks/envs/openenv_task.py): in process, over openenv's
own server started by the user, or served by rlkit as a child; the default mappings; bad input."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from rlkit import cli
from rlkit.errors import ConfigError
from rlkit.tasks import build_task
from rlkit.tasks.envs.openenv_task import parse_action, render_observation

HERE = Path(__file__).parent
INT = {"properties": {"metadata": {"type": "object"}, "guess": {"type": "integer"}}}


@pytest.fixture()
def in_tests_envs(monkeypatch):
    """Run as a user would, from the folder holding their environment module."""
    monkeypatch.chdir(HERE)
    monkeypatch.syspath_prepend(str(HERE))


def test_default_reply_to_action_mapping():
    assert parse_action("I think 7, no: 4", INT) == {"guess": 4}  # the last number
    assert parse_action(" hello \n", {"properties": {"word": {"type": "string"}}}) == {"word": "hello"}
    assert parse_action("Yes.", {"properties": {"ok": {"type": "boolean"}}}) == {"ok": True}
    two = {"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    assert parse_action('move {"x": 1, "y": 0} then {"x": 2, "y": 2}', {**two}) == {"x": 2, "y": 2}
    for reply, schema in (("no digits", INT), ("maybe", {"properties": {"ok": {"type": "boolean"}}}), ("x=1", two)):
        with pytest.raises(ValueError):
            parse_action(reply, schema)


def test_default_observation_to_text_mapping():
    assert render_observation({"prompt": "Guess.", "done": False, "reward": None, "metadata": {}}) == "Guess."
    assert render_observation({"board": "X.O", "legal": [1, 4], "done": False}) == 'board: X.O\nlegal: [1, 4]'


def test_an_in_process_episode_gets_the_envs_rewards_and_invalid_actions_end_it(in_tests_envs):
    task = build_task({"name": "openenv", "env": "guess_env:GuessNumber", "num_train": 4})
    import random

    target = random.Random(3).randint(1, 9)
    episode = task.make_env({"seed": 3}, None)
    assert "from 1 to 9" in episode.reset().observation
    wrong = 1 if target != 1 else 2
    turn = episode.step(f"{wrong}")
    assert (turn.reward, turn.done) == (0.0, False) and ("higher" if wrong < target else "lower") in turn.observation
    turn = episode.step(f"It is {target}.")
    assert (turn.reward, turn.done, turn.metrics["invalid_action"]) == (1.0, True, 0.0)
    episode = task.make_env({"seed": 3}, None)
    episode.reset()
    turn = episode.step("no idea")
    assert (turn.reward, turn.done, turn.metrics["invalid_action"]) == (0.0, True, 1.0)
    retrying = build_task({"name": "openenv", "env": "guess_env:GuessNumber", "num_train": 4, "on_invalid_action": "retry"})
    episode = retrying.make_env({"seed": 3}, None)
    episode.reset()
    turn = episode.step("no idea")  # the env never sees it; the model is told and replies again
    assert (turn.done, turn.metrics["invalid_action"]) == (False, 1.0) and "not a valid action" in turn.observation
    turn = episode.step(f"{target}")
    assert (turn.reward, turn.done, turn.metrics["invalid_action"]) == (1.0, True, 0.5)


def test_a_server_started_with_openenvs_own_create_app_is_reached_by_base_url(in_tests_envs):
    from openenv.core.env_server.http_server import create_app

    from guess_env import EchoWord, WordAction, WordObservation
    from rlkit.serve.app import start_server

    server = start_server(create_app(EchoWord, WordAction, WordObservation, max_concurrent_envs=8))
    try:
        task = build_task({"name": "openenv", "base_url": f"http://127.0.0.1:{server.port}", "num_train": 2})
        episodes = [task.make_env({"seed": 0}, None) for _ in range(3)]  # concurrent WebSocket sessions
        assert [e.reset().observation for e in episodes] == ["Say a word with the letter a."] * 3
        assert [e.step(w).reward for e, w in zip(episodes, ["banana", "xyz", "a"])] == [1.0, 0.0, 1.0]
        for e in episodes:
            e.close()
    finally:
        server.stop()


def test_rlkit_serves_the_class_on_openenvs_server_and_stops_it(in_tests_envs):
    task = build_task({"name": "openenv", "env": "guess_env:GuessNumber", "serve": True, "num_train": 2})
    child = task.server.child
    episode = task.make_env({"seed": 5}, None)
    assert "from 1 to 9" in episode.reset().observation
    assert episode.step("5").done in (False, True)
    episode.close()
    task.close()
    assert child.poll() is not None


def exit_code(argv):
    """``rlkit ARGV``'s exit code, whether the command returns it or exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


def _not_openenv_server():
    class Plain(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"hello": "world"}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("overrides, expected", [
    (["train.task.env=guess_env:NotAnEnv"], "guess_env:NotAnEnv is not an openenv Environment subclass"),
    (["train.task.env=guess_env:Missing"], "'guess_env' has no attribute 'Missing'"),
    (["train.task.env=null", "+train.task.base_url=http://127.0.0.1:9"], "no server answers at http://127.0.0.1:9"),
    (["train.task.env=null", "+train.task.base_url=PLAIN"], "is not an OpenEnv server"),
    (["+train.task.parse=guess_env:GuessAction.model_fields"], "train.task.parse: guess_env:GuessAction.model_fields is not a function"),
    (["+train.task.serve=true", "train.task.env=null"], "give exactly one of env=module:Class"),
    (["+train.task.parse=guess_env:broken_parser"], "train.task.parse: guess_env:broken_parser raised TypeError"),
    (["+train.task.on_invalid_action=skip"], "train.task.on_invalid_action='skip': choose end or retry"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(in_tests_envs, tmp_path, capsys, overrides, expected):
    plain = _not_openenv_server()
    overrides = [o.replace("PLAIN", f"http://127.0.0.1:{plain.server_address[1]}") for o in overrides]
    run = tmp_path / "run"
    try:
        code = exit_code(["train", "recipe=openenv_grpo_smoke", *overrides, f"run_dir={run}"])
    finally:
        plain.shutdown()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and expected in err[0], err
    assert not run.exists()


def test_a_missing_env_module_names_the_module():
    with pytest.raises(ConfigError, match="no_such_module"):
        build_task({"name": "openenv", "env": "no_such_module:Env"})


def test_a_parser_of_the_users_replaces_the_default(in_tests_envs):
    task = build_task({"name": "openenv", "env": "guess_env:GuessNumber", "parse": "guess_env:picky_parser", "num_train": 2})
    episode = task.make_env({"seed": 3}, None)
    episode.reset()
    assert episode.step("I guess 3").metrics["invalid_action"] == 1.0  # the default would have read 3
    episode = task.make_env({"seed": 3}, None)
    episode.reset()
    assert episode.step("3").metrics["invalid_action"] == 0.0
