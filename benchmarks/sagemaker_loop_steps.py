"""Round trips and seconds per RL and SFT step on SageMaker: the ``--loops`` part of
``benchmarks/sagemaker_overhead.py`` (run through it).

Each loop runs ``rlkit train ... backend=sagemaker`` in this process against ``rlkit emulate
sagemaker`` (a subprocess; strict answers, the SDK's own cadence unless ``--cadence fast``), twice:

- **before**: ``backend.always_score_logprobs=true train.mismatch_every=1`` -- the trainer's
  logprobs scored after every ``forward_backward`` (a ``compute_logprobs`` per datum, and for SFT a
  ``saveWeights`` of its own each step), as rlkit did before scoring became opt-in. (The RL loop's
  new order -- the publish queued before waiting for the pass's outputs -- is not undone by the flag.)
- **after**: the defaults: nothing scored unless something needs it (the RL loop's ``mismatch/*``
  every ``train.mismatch_every`` = 10 steps, so on step 0 here).

A step's round trips are the emulator's runtime and control-plane requests between two lines of
``metrics.jsonl`` (submits, polls, creation and listing calls; the emulator's own helper routes
are not counted); its seconds are the loop's ``time/step`` (RL) or the wall time between lines (SFT).
Evaluation is off (``train.eval.problems=0`` / ``data.eval=null``, no generation), so every line is
one training step; the session's creation and first publish come before the first. The SFT loop is
pipelined (step i is submitted before step i-1 is logged), so its per-line split is approximate:
compare its means.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

RL = ["recipe=arithmetic_grpo_smoke", "train.eval.problems=0", "train.eval_every=0"]
SFT = ["recipe=sft_gsm8k_smoke", "data.eval=null", "train.generate.examples=0"]
BEFORE = ["backend.always_score_logprobs=true"]


def _requests(url: str) -> int:
    with urllib.request.urlopen(url + "/_emulator/stats", timeout=30) as r:
        stats = json.loads(r.read())["stats"]
    return int(sum(v for k, v in stats.items() if k.startswith("requests:")))


def run_loop(url: str, overrides: List[str], steps: int) -> Dict[str, Any]:
    """One ``rlkit train`` run in this process; per-step round trips and seconds."""
    from rlkit import cli
    from rlkit.runs import Run

    marks: List[tuple] = []
    original = Run.log

    def log(self, step, metrics):  # a step's line: where its round trips end
        marks.append((step, _requests(url), time.perf_counter(), dict(metrics)))
        return original(self, step, metrics)

    Run.log = log
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = cli.compose([*overrides, f"train.steps={steps}", "backend=sagemaker", "logger.console=false"])
            t0, r0 = time.perf_counter(), _requests(url)
            started = {"t": t0, "r": r0}
            opened = Run.start

            def start(self, *a, **kw):  # the session exists (and the first publish is done) by now
                started["t"], started["r"] = time.perf_counter(), _requests(url)
                return opened(self, *a, **kw)

            Run.start = start
            try:
                cli.execute(cfg, Path(tmp) / "run")
            finally:
                Run.start = opened
            total_s, total_r = time.perf_counter() - t0, _requests(url) - r0
    finally:
        Run.log = original
    rows, last_r, last_t = [], started["r"], started["t"]
    for step, reqs, t, metrics in marks:
        if "train/grad_norm" not in metrics:  # the final evaluation line
            continue
        seconds = metrics.get("time/step", t - last_t)
        rows.append({"step": step, "round_trips": reqs - last_r, "seconds": float(seconds),
                     "scored_tokens": float(metrics.get("train/logprobs:scored_tokens", 0.0))})
        last_r, last_t = reqs, t
    return {"steps": rows, "total_s": total_s, "total_round_trips": total_r}


def summarise(name: str, result: Dict[str, Any]) -> str:
    steps = result["steps"]
    rt = sum(s["round_trips"] for s in steps) / len(steps)
    sec = sum(s["seconds"] for s in steps) / len(steps)
    per = ", ".join(f"{s['round_trips']} rt / {s['seconds']:.1f} s" for s in steps)
    return f"| {name} | {rt:.1f} | {sec:.1f} | {per} | {result['total_round_trips']} |"


def main(url: str, cadence: str, steps: int, out_json: str = "") -> None:
    os.environ.setdefault("RLKIT_QUIET", "1")
    results: Dict[str, Any] = {}
    for loop, overrides in (("RL (arithmetic_grpo_smoke)", RL), ("SFT (sft_gsm8k_smoke)", SFT)):
        for variant, extra in (("before: always scored", BEFORE + (["train.mismatch_every=1"] if loop.startswith("RL") else [])),
                               ("after: scored on need", [])):
            results[f"{loop}, {variant}"] = run_loop(url, overrides + extra, steps)
            print(f"done: {loop}, {variant}", flush=True)
    print(f"\nstrict emulator, {cadence} cadence, tiny model, {steps} steps per run, evaluation off\n")
    print("| loop, variant | round trips / step (mean) | s / step (mean) | each step | run round trips (with session setup) |")
    print("|---|---:|---:|---|---:|")
    for name, result in results.items():
        print(summarise(name, result))
    if out_json:
        Path(out_json).write_text(json.dumps({"cadence": cadence, "steps": steps, "results": results}, indent=2))
