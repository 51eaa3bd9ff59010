"""``benchmarks/gpu_check.sh --smoke``: the GPU check's Python parts (both arms, the table) run on
the CPU at tiny shapes, so the check is not broken when a GPU is lent. Measures nothing useful."""

import json
import os
import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_runs_both_arms_and_writes_the_table(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--smoke", str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for arm in ("hf", "rlkit"):
        result = json.loads((tmp_path / f"{arm}.json").read_text())
        assert result["arm"] == arm and result["rl_step_s"] > 0 and result["train_tok_s"] > 0 and 0 < result["train_mfu"]
        assert set(result["decode_tok_s"]) == {"1", "4"} and all(v > 0 for v in result["decode_tok_s"].values())
    table = (tmp_path / "table.md").read_text()
    assert "| RL step, s (median) |" in table and "| decode tok/s, batch 4 |" in table and "training MFU" in table
    assert "decode path: fused llama decode" in table


def test_gpu_models_know_the_issue_26_shapes():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_models

    assert gpu_models.DEFAULT == ["qwen2.5-1.5b-shape", "llama3-8b-shape"]
    llama = gpu_models.SHAPES["llama3-8b-shape"]
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["num_key_value_heads"], llama["vocab_size"]) == (4096, 32, 8, 128256)


def test_gpu_check_nproc_smoke_writes_each_ranks_row(tmp_path):
    """``gpu_check.sh --nproc 2 --smoke``: the multi-GPU check's parts (torchrun, 1 and 2 ranks, the table; the smoke runs LoRA only) run on 2 CPU ranks; a bad rank count is one line, exit 2."""
    env = dict(os.environ, PYTHON=sys.executable)
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    bad = subprocess.run(["bash", script, "--nproc", "two"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--nproc two: expected a whole number" in bad.stdout
    proc = subprocess.run(["bash", script, "--nproc", "2", "--smoke", str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = [line.split(" | ") for line in (tmp_path / "ranks.md").read_text().splitlines() if line.startswith("| lora") or line.startswith("| full")]
    assert sorted((r[0].strip("| "), r[1], r[2]) for r in rows) == sorted(
        ("lora", ranks, rank) for ranks, rank in (("1", "0"), ("2", "0"), ("2", "1")))  # the smoke: LoRA only
    assert all(r[-1].strip(" |").endswith(" s") for r in rows)  # a step's seconds on every row
