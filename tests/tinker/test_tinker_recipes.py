"""``rlkit train ... backend=tinker`` against ``rlkit serve tinker``'s server on the tiny model:
the RL smoke recipe's metrics equal the local backend's (same seed; the server's LoRA alpha set to
the recipe's), the SFT smoke recipe trains and checkpoints to ``tinker://`` paths (resuming from
one is ``create_training_client_from_state_with_optimizer``, tested in test_adapter.py), and every
Tinker session a run opens is finished, also when the run fails."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

pytest.importorskip("tinker")

SAGEMAKER_TESTS = str(
    Path(__file__).resolve().parents[1] / "sagemaker"
)  # sm_toy_task: a reward that varies on the tiny model
RL = [  # the server and the local run decode one request at a time (max_batch_rows=1)
    "recipe=arithmetic_grpo_smoke",
    "+train.task._target_=sm_toy_task.ToyTask",
    "~train.task.name",
    "~train.task.ops",
    "~train.task.num_shots",
    "train.steps=2",
    "train.checkpoint_every=1",
    "train.max_tokens=6",
    "train.groups_per_batch=2",
    "train.eval.problems=2",
]
EXACT_KEYS_SKIP = ("time/",)


@pytest.fixture(scope="module")
def tinker_server(tmp_path_factory):
    from rlkit.backends.tinker.server import TinkerServer

    # lora_alpha 32 = the recipes' alpha (arithmetic_grpo: rank 16, alpha 32); Tinker's API has rank only
    server = TinkerServer(
        state_dir=str(tmp_path_factory.mktemp("state")), lora_alpha=32, max_batch_rows=1, num_threads=1
    ).start()
    yield server
    server.stop()


def train(*args, cwd, timeout=300):
    env = {**os.environ, "TINKER_TELEMETRY": "0"}
    env["PYTHONPATH"] = SAGEMAKER_TESTS + os.pathsep + env.get("PYTHONPATH", "")
    return warm_rlkit.run(["train", *args], cwd=cwd, env=env, timeout=timeout)


def tinker_args(server):  # model.alpha=32: the service's fixed alpha (the tiny model's recipes say 8)
    return ["backend=tinker", f"backend.base_url={server.url}", "backend.api_key=tml-test", "backend.num_threads=1",
            "model.alpha=32"]


def metrics(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def all_sessions_finished(server):
    with server.state.lock:
        return [s.finished for s in server.state.sessions.values()]


def test_rl_smoke_on_tinker_equals_local(tinker_server, tmp_path):
    local = train(*RL, "backend.max_batch_rows=1", f"run_dir={tmp_path / 'local'}", cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    remote = train(*RL, *tinker_args(tinker_server), f"run_dir={tmp_path / 'tinker'}", cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr[-3000:]
    want, got = metrics(tmp_path / "local"), metrics(tmp_path / "tinker")
    assert [m["step"] for m in got] == [m["step"] for m in want]
    compared = 0
    for g, w in zip(got, want):
        for key, value in w.items():
            if key.startswith(EXACT_KEYS_SKIP) or not isinstance(value, (int, float)) or key not in g:
                continue
            assert math.isclose(g[key], value, rel_tol=1e-5, abs_tol=1e-6), (g["step"], key, g[key], value)
            compared += 1
    assert compared > 20 and any(m.get("train/grad_norm", 0) > 0 for m in got)
    records = [json.loads(x) for x in (tmp_path / "tinker" / "checkpoints.jsonl").read_text().splitlines()]
    assert records and all(r["checkpoint"].startswith("tinker://") for r in records)
    assert all(all_sessions_finished(tinker_server))


def test_sft_smoke_on_tinker_trains_and_checkpoints_to_tinker_paths(tinker_server, tmp_path):
    run = tmp_path / "sft"
    args = [
        "recipe=sft_gsm8k_smoke",
        "train.steps=2",
        "train.checkpoint_every=1",
        "train.eval_every=0",
        *tinker_args(tinker_server),
        f"run_dir={run}",
    ]
    first = train(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = [m for m in metrics(run) if "train/loss" in m]
    assert len(rows) == 2 and rows[-1]["train/loss"] < rows[0]["train/loss"]
    records = [json.loads(x) for x in (run / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all("/weights/" in r["checkpoint"] for r in records)
    assert all(r["checkpoint"].startswith("tinker://") for r in records)
    assert all(all_sessions_finished(tinker_server))


def test_a_failing_run_still_finishes_its_session(tinker_server, tmp_path):
    before = len(all_sessions_finished(tinker_server))
    bad = train(
        "recipe=sft_gsm8k_smoke",
        "train.steps=1",
        *tinker_args(tinker_server),
        "train.init_checkpoint=tinker://nope/weights/missing",
        f"run_dir={tmp_path / 'bad'}",
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
    assert "init_checkpoint" in bad.stderr.strip().splitlines()[-1]
    sessions = all_sessions_finished(tinker_server)
    assert len(sessions) > before and all(sessions)


def test_every_other_loop_runs_on_tinker(tinker_server, tmp_path, monkeypatch):
    """DPO, on- and off-policy distillation (teacher: a tinker:// checkpoint this test trains), code
    RL and tool RL, one step each with backend=tinker, in this process (no
    interpreter start per run): each exits 0, logs finite training metrics, checkpoints to
    tinker:// paths, and finishes every session it opened."""
    from rlkit.cli import main

    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.chdir(tmp_path)

    def run(name, *args):
        before = len(all_sessions_finished(tinker_server))
        run_dir = tmp_path / name
        code = main(["train", *args, "train.steps=1", "train.checkpoint_every=1", *tinker_args(tinker_server),
                     f"run_dir={run_dir}"])
        assert code == 0, name
        rows = metrics(run_dir)
        trained = [v for m in rows for k, v in m.items() if k in ("train/loss", "train/loss:sum", "train/grad_norm")]
        assert trained and all(math.isfinite(v) for v in trained), (name, rows[-1])
        records = [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
        assert records and all(r["checkpoint"].startswith("tinker://") for r in records), name
        sessions = all_sessions_finished(tinker_server)
        assert len(sessions) > before and all(sessions), (name, sessions)
        return records[-1]["checkpoint"]

    teacher = run("sft", "recipe=sft_gsm8k_smoke", "train.eval_every=0")
    run("dpo", "recipe=dpo_gsm8k_smoke")
    run("onpolicy_distill", "recipe=onpolicy_distill_smoke", f"train.teacher.checkpoint={teacher}")
    run("offpolicy_distill", "recipe=offpolicy_distill_smoke", f"train.teacher.checkpoint={teacher}")
    run("code", "recipe=code_grpo_smoke", "train.temperature=1.0")  # Tinker's trainer scores at temperature 1
    run("tool", "recipe=tool_arithmetic_grpo_smoke")  # sft_then_rl is task_sft then rl: both covered


def test_a_temperature_tinker_cannot_score_is_one_line_and_exit_2(tinker_server, tmp_path, capsys):
    """Tinker's trainer scores at temperature 1 only: an RL run sampling at 0.7 is refused by the
    config check — one line naming the field and the way out, exit 2, no session, nothing written —
    and with ``train.score_with_temperature=false`` it runs."""
    from rlkit.cli import main

    before = len(all_sessions_finished(tinker_server))
    for loop_args in (["recipe=arithmetic_grpo_smoke", "train.temperature=0.7"],
                      ["recipe=onpolicy_distill_smoke", "train.temperature=0.7"]):
        assert main(["train", *loop_args, "train.steps=1", *tinker_args(tinker_server), f"run_dir={tmp_path / 'hot'}"]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("rlkit: error: train.temperature=0.7: Tinker's trainer scores at temperature 1 only"), last
    assert len(all_sessions_finished(tinker_server)) == before and not (tmp_path / "hot").exists()
    ok = train("recipe=arithmetic_grpo_smoke", "train.temperature=0.7", "train.score_with_temperature=false", "train.steps=1",
               *tinker_args(tinker_server), f"run_dir={tmp_path / 'cool'}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert all(all_sessions_finished(tinker_server))


def test_an_alpha_tinker_cannot_honour_is_one_line_and_exit_2(tinker_server, tmp_path, capsys):
    """Tinker has no LoRA alpha (the service's scale is fixed): a recipe asking for another alpha is
    refused before any session exists — one line naming model.alpha and the fix, exit 2."""
    from rlkit.cli import main

    before = len(all_sessions_finished(tinker_server))
    code = main(["train", "recipe=sft_gsm8k_smoke", "train.steps=1", *tinker_args(tinker_server)[:-1], f"run_dir={tmp_path / 'a'}"])
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("rlkit: error: model.alpha=8: Tinker's LoRA scale is fixed at alpha 32") and "model.alpha=32" in last
    assert len(all_sessions_finished(tinker_server)) == before and not (tmp_path / "a").exists()
