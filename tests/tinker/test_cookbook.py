"""tinker-cookbook 0.6.1's own SFT and RL recipes, unchanged (their CLIs, run with ``python -m``),
against the Tinker-compatible server on the tiny model, offline: the SFT recipe reads the
cookbook's own example conversations, the RL recipe uses its arithmetic environment (no data),
and the tokenizer is the local directory named as ``model_name``. See cookbook/tinker/README.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tinker")
cookbook = pytest.importorskip("tinker_cookbook")

from rlkit.backends.local.models import TINY_TOKENIZER_DIR  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

EXAMPLES = Path(cookbook.__file__).parent / "example_data" / "conversations.jsonl"


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    from rlkit.backends.tinker.server import TinkerServer

    server = TinkerServer(state_dir=str(tmp_path_factory.mktemp("state")), num_threads=1).start()
    yield server.url
    server.stop()


def recipe(module, *args, cwd):
    env = {
        **os.environ,
        "TINKER_API_KEY": "tml-local",
        "TINKER_TELEMETRY": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "behavior_if_log_dir_exists=delete"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def rows(log_path):
    return [json.loads(x) for x in (Path(log_path) / "metrics.jsonl").read_text().splitlines()]


def checkpoints(log_path):
    return [json.loads(x) for x in (Path(log_path) / "checkpoints.jsonl").read_text().splitlines()]


def test_cookbook_sft_recipe_unchanged(server_url, tmp_path):
    log = tmp_path / "sft"
    recipe(
        "tinker_cookbook.recipes.chat_sl.train",
        f"model_name={TINY_TOKENIZER_DIR}",
        "renderer_name=qwen3_instruct",
        f"dataset={EXAMPLES}",
        f"base_url={server_url}",
        "batch_size=16",
        "max_steps=4",
        "learning_rate=1e-3",
        "lora_rank=4",
        "eval_every=0",
        "save_every=2",
        "max_length=256",
        f"log_path={log}",
        cwd=tmp_path,
    )
    train = [r for r in rows(log) if "train_mean_nll" in r]
    assert len(train) == 4 and train[-1]["train_mean_nll"] < train[0]["train_mean_nll"]
    assert all(r["grad_norm"] > 0 for r in train)
    saved = checkpoints(log)
    assert saved[-1]["state_path"].startswith("tinker://") and "/sampler_weights/" in saved[-1]["sampler_path"]


def test_cookbook_rl_recipe_unchanged(server_url, tmp_path):
    log = tmp_path / "rl"
    recipe(
        "tinker_cookbook.recipes.math_rl.train",
        f"model_name={TINY_TOKENIZER_DIR}",
        "renderer_name=qwen3_instruct",
        "env=arithmetic",
        f"base_url={server_url}",
        "group_size=4",
        "groups_per_batch=4",
        "max_tokens=5",
        "max_steps=2",
        "learning_rate=1e-3",
        "lora_rank=4",
        "eval_every=0",
        "save_every=1",
        "loss_fn=importance_sampling",
        f"log_path={log}",
        cwd=tmp_path,
    )
    steps = [r for r in rows(log) if "env/all/reward/total" in r]
    assert len(steps) == 2 and all(r["tokens/sampled"] > 0 for r in steps)
    saved = checkpoints(log)
    assert saved and all(c["state_path"].startswith("tinker://") for c in saved if "state_path" in c)
