"""loop=sft_then_rl: SFT, then RL from the SFT stage's last checkpoint, in one command; a rerun of
the same command continues it without training anything again."""

import json
import os

import yaml
import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def rlkit(args, cwd):
    return warm_rlkit.run(["train", *args], cwd=cwd, env={**os.environ}, timeout=300)


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_sft_then_rl_in_one_command_and_resumed(tmp_path):
    args = ["recipe=arithmetic_sft_then_grpo_smoke", "run_dir=run"]
    proc = rlkit(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    sft_ckpt = lines(run / "sft" / "checkpoints.jsonl")[-1]["checkpoint"]
    rl_config = yaml.safe_load((run / "rl" / "config.yaml").read_text())
    assert rl_config["loop"] == "rl" and rl_config["train"]["init_checkpoint"] == sft_ckpt  # RL starts from SFT's weights
    assert yaml.safe_load((run / "sft" / "config.yaml").read_text())["loop"] == "task_sft"
    assert [m["step"] for m in lines(run / "sft" / "metrics.jsonl")] == [0, 1, 2]
    assert [m["step"] for m in lines(run / "rl" / "metrics.jsonl")] == [0, 1, 2]
    summary = lines(run / "metrics.jsonl")
    assert [m["step"] for m in summary] == [0, 1, 2] and "rl/eval/greedy_accuracy" in summary[-1]
    assert "after SFT" in proc.stdout and "after RL" in proc.stdout

    sft_steps = len(lines(run / "sft" / "checkpoints.jsonl"))
    again = rlkit(args, tmp_path)  # the same command: both stages are complete, nothing trains again
    assert again.returncode == 0, again.stderr
    assert len(lines(run / "sft" / "checkpoints.jsonl")) == sft_steps
    assert [m["step"] for m in lines(run / "rl" / "metrics.jsonl")] == [0, 1, 2]
