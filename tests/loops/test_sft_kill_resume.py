"""A run killed with SIGKILL at any point and resumed writes the same metrics, checkpoints,
transcripts and adapter weights as a run that never stopped (tiny model, deterministic CPU)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ARGS = [
    "recipe=sft_gsm8k_smoke",
    "backend.num_threads=1",
    "data.train.limit=200",
    "train.steps=24",
    "train.checkpoint_every=4",
    "train.eval_every=6",
    "train.generate.examples=2",
    "train.generate.max_tokens=4",
    "train.generate.every=12",
]


def start(run_dir, *extra, cwd):
    return subprocess.Popen(
        [sys.executable, "-m", "rlkit", "train", *ARGS, f"run_dir={run_dir}", *extra],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).exists() else []


def deterministic(metrics):
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


def same_metrics(got, want):
    """Equal keys and values; floats to 1e-6 relative (float32 sums may differ in the last bit)."""
    got, want = deterministic(got), deterministic(want)
    assert [sorted(g) for g in got] == [sorted(w) for w in want]
    for g, w in zip(got, want):
        for k in g:
            if isinstance(g[k], float):
                assert math.isclose(g[k], w[k], rel_tol=1e-6, abs_tol=1e-9), (g["step"], k, g[k], w[k])
            else:
                assert g[k] == w[k], (g["step"], k, g[k], w[k])


def adapter(run_dir):
    last = lines(run_dir / "checkpoints.jsonl")[-1]["checkpoint"]
    return load_file(last[len("local://"):] + "/adapter_model.safetensors")


def transcripts(run_dir):
    return {p.name: p.read_text() for p in sorted((run_dir / "transcripts").glob("*.jsonl"))}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ref")
    proc = start(cwd / "run", cwd=cwd)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return cwd / "run"


def kill_when(proc, condition, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            assert proc.poll() is None, "the run finished before the kill point; make it longer"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("kill point never reached: " + proc.stderr.read())


@pytest.mark.parametrize(
    "kill_point",
    [
        "first checkpoint recorded",  # right after checkpoints.jsonl gets its first record
        "mid interval",  # 2 metric lines past a checkpoint: those lines must be recomputed, not duplicated
    ],
)
def test_sigkill_then_resume_equals_uninterrupted(reference, tmp_path, kill_point):
    run = tmp_path / "run"
    proc = start(run, cwd=tmp_path)
    if kill_point == "first checkpoint recorded":
        kill_when(proc, lambda: len(lines(run / "checkpoints.jsonl")) >= 1)
    else:
        kill_when(proc, lambda: len((run / "metrics.jsonl").read_text().splitlines()) >= 10 if (run / "metrics.jsonl").exists() else False)
    killed_at = len(lines(run / "metrics.jsonl"))
    assert killed_at < 25
    resumed = warm_rlkit.run(["train", f"resume={run}"], cwd=tmp_path, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr

    got, want = lines(run / "metrics.jsonl"), lines(reference / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(25))  # nothing lost, nothing duplicated
    same_metrics(got, want)
    assert [(c["step"], c["loop_state"]) for c in lines(run / "checkpoints.jsonl")] == [
        (c["step"], c["loop_state"]) for c in lines(reference / "checkpoints.jsonl")
    ]
    assert transcripts(run) == transcripts(reference)
    a, b = adapter(run), adapter(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (run / "metrics.png").exists()
