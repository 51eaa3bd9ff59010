"""A user's loss subclass, selected through the Hydra config, trains via the CLI — in one pass on
the local engine, which runs Loss objects natively (no ``linearised`` marker)."""

import json
import os
from pathlib import Path
import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ROOT = Path(__file__).resolve().parents[2]


def test_subclass_selected_by_target_trains(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "cookbook" / "custom_loss"), str(ROOT / "tests" / "rl")])}
    args = [
        "recipe=arithmetic_grpo_smoke", "+train.task._target_=toy_task.ToyTask", "~train.task.name", "~train.task.ops", "~train.task.num_shots",
        "loss._target_=my_losses.AsymmetricClipPPO", "+loss.positive_clip_high=1.28", "train.steps=2", "train.learning_rate=0.05",
        f"run_dir={tmp_path / 'run'}",
    ]
    out = warm_rlkit.run(["train", *args], cwd=tmp_path, env=env, timeout=240)
    assert out.returncode == 0, out.stderr
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "train/grad_norm" in m]
    assert trained and not any("train/linearised" in m for m in trained)
    assert any(m["train/grad_norm"] > 0 for m in trained)
    assert "train/asymmetric_ppo/clip_frac:mean" in trained[0]


def test_ppo_with_kl_config_computes_reference_logprobs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "rl")}
    args = [
        "recipe=arithmetic_grpo_smoke", "+train.task._target_=toy_task.ToyTask", "~train.task.name", "~train.task.ops", "~train.task.num_shots",
        "loss=ppo_kl", "train.steps=1", f"run_dir={tmp_path / 'run'}",
    ]
    out = warm_rlkit.run(["train", *args], cwd=tmp_path, env=env, timeout=240)
    assert out.returncode == 0, out.stderr
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert "train/kl_penalty/k3:mean" in first and "train/linearised" not in first  # one pass on the local engine
    assert abs(first["train/kl_penalty/k3:mean"]) < 1e-4  # step 0: policy == reference
