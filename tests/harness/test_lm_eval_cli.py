"""lm-eval's own command line with ``--model rlkit`` (``python -m rlkit.harness``, lm-eval 0.4.13 having
no plugin hook), offline through rlkit's task directory, and that directory's tasks as lm-eval loads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a subprocess running lm-eval's CLI


def test_task_directory_is_lm_evals_tasks_on_rlkits_data_and_sandbox(offline):
    from lm_eval.tasks import TaskManager

    from rlkit.harness import code_exec
    from rlkit.harness.taskdir import task_dir

    folder = task_dir()
    assert {"gsm8k.yaml", "mbpp.yaml", "humaneval.yaml", "mbpp_plus.yaml"} <= {p.name for p in folder.glob("*.yaml")}
    loaded = TaskManager(include_defaults=False, include_path=str(folder)).load(["gsm8k", "mbpp"])["tasks"]
    assert loaded["gsm8k"].config.dataset_path == "json" and len(loaded["gsm8k"].test_docs()) == 1319
    metric = loaded["mbpp"]._metric_fn_list["pass_at_1"]
    assert metric.__self__.__globals__["pass_at_k"] is code_exec.code_eval()  # lm-eval's pass_at_1, rlkit's sandbox


def test_lm_eval_cli_with_model_rlkit(tmp_path, hf_model_dir):
    """The same run with ``--model hf`` gives the same text (not repeated here: tests/harness/test_equivalence.py)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "rlkit.harness", "--model", "rlkit", "--model_args",
                           f"model={hf_model_dir},precision=fp32", "--tasks", "gsm8k,mbpp", "--limit", "2",
                           "--confirm_run_unsafe_code", "--gen_kwargs", "max_gen_toks=16", "--log_samples",
                           "--output_path", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "|gsm8k|" in proc.stdout and "|mbpp |" in proc.stdout
    results = json.loads(next(tmp_path.rglob("results_*.json")).read_text())
    assert results["configs"]["mbpp"]["dataset_path"] == "json" and results["n-samples"]["gsm8k"]["effective"] == 2
