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


# -- where each step's time goes --------------------------------------------------------------------
SMOKE = ["recipe=arithmetic_grpo_smoke"]  # the user's command, evaluation included


def _record_operations(ops: List[Dict[str, Any]]):
    """Wrap the adapter's two entry points to the service (``submit``: an SDK call and its polls;
    ``run``: background work such as the load for sampling) to record each operation's interval."""
    from rlkit.backends.sagemaker.adapter import SageMakerServiceClient

    originals = SageMakerServiceClient.submit, SageMakerServiceClient.run

    def timed(original):
        def wrapper(self, fn, *args, **kwargs):
            operation = args[1] if original is originals[0] else args[0]
            row = {"op": operation, "t0": time.perf_counter(), "t1": None}
            ops.append(row)
            future = original(self, fn, *args, **kwargs)
            future.add_done_callback(lambda f: row.__setitem__("t1", time.perf_counter()))
            return future

        return wrapper

    SageMakerServiceClient.submit, SageMakerServiceClient.run = timed(originals[0]), timed(originals[1])
    return lambda: setattr(SageMakerServiceClient, "submit", originals[0]) or setattr(SageMakerServiceClient, "run", originals[1])


def serial_waits(intervals: List[tuple]) -> int:
    """How many waits one after another the intervals make (overlapping ones count once): on the
    SDK's cadence each costs at least one 2 s poll, whatever the operation."""
    waits, end = 0, float("-inf")
    for t0, t1 in sorted(intervals):
        if t0 >= end:
            waits += 1
            end = t1
        else:
            end = max(end, t1)
    return waits


def breakdown(url: str, overrides: List[str]) -> Dict[str, Any]:
    """One ``rlkit train`` run (the smoke recipe as a user runs it): total seconds, the session
    setup, and per step the loop's own split (``time/*``) and the service operations it waited on."""
    from rlkit import cli
    from rlkit.runs import Run

    ops: List[Dict[str, Any]] = []
    marks: List[tuple] = []
    original_log = Run.log

    def log(self, step, metrics):
        marks.append((step, time.perf_counter(), dict(metrics)))
        return original_log(self, step, metrics)

    restore = _record_operations(ops)
    Run.log = log
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = cli.compose([*overrides, "backend=sagemaker", "logger.console=false"])
            t0 = time.perf_counter()
            cli.execute(cfg, Path(tmp) / "run")
            total = time.perf_counter() - t0
    finally:
        Run.log = original_log
        restore()
    windows, last = [], t0
    for step, t, metrics in marks:
        windows.append({"step": step, "start": last, "end": t, "metrics": metrics})
        last = t
    rows = []
    for w in windows:
        inside = [o for o in ops if w["start"] <= o["t0"] < w["end"] and o["t1"] is not None]
        kinds: Dict[str, List[float]] = {}
        for o in inside:
            kinds.setdefault(o["op"], []).append(o["t1"] - o["t0"])
        split = {k[5:]: round(v, 2) for k, v in w["metrics"].items() if k.startswith("time/") and k not in ("time/step", "time/rollout")}
        rows.append({"step": w["step"], "seconds": w["end"] - w["start"], "loop": split, "serial_waits": serial_waits([(o["t0"], o["t1"]) for o in inside]),
                     "operations": {k: (len(v), sum(v) / len(v)) for k, v in sorted(kinds.items())}})
    setup = (windows[0]["start"] if windows else t0) - t0
    first_op = min((o["t0"] for o in ops), default=t0)
    return {"total_s": total, "before_first_operation_s": first_op - t0, "setup_s": setup, "steps": rows}


def print_breakdown(result: Dict[str, Any], cadence: str) -> None:
    print(f"\nrlkit train recipe=arithmetic_grpo_smoke backend=sagemaker: {result['total_s']:.1f} s end to end "
          f"(strict emulator, {cadence} cadence; session creation and the first publish are in step 0's line)\n")
    print("| line | seconds | serial waits | the loop's split (s) | operations: count x mean s |")
    print("|---|---:|---:|---|---|")
    for r in result["steps"]:
        ops = ", ".join(f"{k} {n}x{mean:.1f}" for k, (n, mean) in r["operations"].items())
        loop = ", ".join(f"{k} {v}" for k, v in r["loop"].items() if v >= 0.05)
        label = "final eval" if "train/grad_norm" not in r["loop"] and "wait_rollout" not in r["loop"] else f"step {r['step']}"
        print(f"| {label} | {r['seconds']:.1f} | {r['serial_waits']} | {loop} | {ops} |")
