"""Reproduce the results table of cookbook/dpo/README.md.

    python cookbook/dpo/run.py                 # 3 seeds of `rlkit train recipe=dpo_gsm8k`, then the table
    python cookbook/dpo/run.py --summarise     # only rebuild the table from runs/cookbook/dpo/*

Seed 0 also samples GSM8K answers before the first step (the base model's greedy answers do not
depend on the seed, so seeds 1 and 2 skip that: train.generate_at_start=false).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "runs" / "cookbook" / "dpo"
SEEDS = (0, 1, 2)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # Student t quantiles, by degrees of freedom


def mean_ci(values):
    """``(mean, half-width of the 95% confidence interval)`` with Student's t."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T_975[n - 1] * sd / math.sqrt(n)


def fmt(values, digits=3):
    m, h = mean_ci(values)
    return f"{m:.{digits}f} ± {h:.{digits}f}" if values and not math.isnan(h) else (f"{m:.{digits}f}" if values else "—")


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def train(seed: int) -> float:
    run_dir = RUNS / f"seed{seed}"
    args = [sys.executable, "-m", "rlkit", "train", "recipe=dpo_gsm8k", f"seed={seed}", f"run_dir={run_dir}",
            "logger.console=false", f"train.generate_at_start={'true' if seed == 0 else 'false'}"]
    print(" ".join(args[2:]), flush=True)
    t0 = time.time()
    subprocess.run(args, cwd=ROOT, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return time.time() - t0


def summarise() -> dict:
    runs = {}
    for seed in SEEDS:
        path = RUNS / f"seed{seed}" / "metrics.jsonl"
        if path.exists():
            runs[seed] = lines(path)
    rows = {}
    for name, key in (("held-out preference accuracy (implicit reward)", "eval/preference_accuracy"),
                      ("held-out log-likelihood accuracy (policy alone)", "eval/logp_accuracy"),
                      ("held-out reward margin", "eval/reward_margin"),
                      ("held-out chosen reward", "eval/chosen_reward"),
                      ("held-out rejected reward", "eval/rejected_reward"),
                      ("held-out DPO loss", "eval/loss"),
                      ("GSM8K greedy answer accuracy", "eval/answer_accuracy")):
        before = [m[0][key] for m in runs.values() if key in m[0]]
        after = [m[-1][key] for m in runs.values() if key in m[-1]]
        rows[name] = {"before": before, "after": after}
    train_acc = [sum(x["train/accuracy"] for x in m[-4:-1]) / 3 for m in runs.values()]
    seconds = [m[-2]["time/elapsed_s"] for m in runs.values()]
    out = {"seeds": list(runs), "rows": rows, "train_accuracy_last3": train_acc, "train_seconds": seconds}
    print(f"\nseeds: {list(runs)}\n\n| metric | before (step 0) | after |\n|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {fmt(r['before'])} | {fmt(r['after'])} |")
    print(f"\ntrain preference accuracy, mean of the last 3 steps: {fmt(train_acc)}; training seconds per run: {fmt(seconds, 0)}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--summarise", action="store_true")
    args = parser.parse_args()
    if not args.summarise:
        for s in SEEDS:
            print(f"seed {s}: {train(s):.0f} s", flush=True)
    result = summarise()
    (Path(__file__).parent / "results.json").write_text(json.dumps(result, indent=1) + "\n")
