"""Reproduce the results tables of cookbook/distillation/README.md.

    python cookbook/distillation/run.py                # everything below, then the tables
    python cookbook/distillation/run.py --summarise    # only rebuild the tables from runs/cookbook/distillation/*

1. ``prompt_distillation`` for seeds 0, 1, 2 (teacher = the base model + a long system prompt).
2. The teacher for on-policy distillation: SFT of the base model on the correct answers of the
   arithmetic task's 512 training problems (the ``sft`` loop through the ``sft_gsm8k`` recipe with
   its data and format overridden; seed 0), in the student's prompt format.
3. ``onpolicy_distill`` and ``offpolicy_distill`` (SFT on the teacher's samples) for seeds 0, 1, 2,
   both distilling that checkpoint into the base model with the same problems, samples per step,
   learning rate and evaluation.
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
RUNS = ROOT / "runs" / "cookbook" / "distillation"
SEEDS = (0, 1, 2)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}  # Student t quantiles, by degrees of freedom
TASK = {"ops": ["+"], "num_train": 512, "num_test": 100, "num_shots": 0, "prefill": True}  # as in the recipes
TEACHER_SFT = [
    "recipe=sft_gsm8k", "seed=0", "backend.precision=bf16",
    "train.format.transform=null", "train.format.messages_field=messages", "train.format.max_length=128",
    "train.steps=25", "train.batch_tokens=1024", "train.learning_rate=5.0e-4", "train.warmup_steps=2",
    "train.eval_every=0", "train.checkpoint_every=0", "train.generate.examples=0", "data.eval.limit=50",
]


def mean_ci(values):
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T_975[n - 1] * sd / math.sqrt(n)


def fmt(values, digits=3):
    if not values:
        return "—"
    m, h = mean_ci(values)
    return f"{m:.{digits}f}" if math.isnan(h) else f"{m:.{digits}f} ± {h:.{digits}f}"


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()] if Path(path).exists() else []


def rlkit_train(*overrides: str) -> float:
    args = [sys.executable, "-m", "rlkit", "train", *overrides, "logger.console=false"]
    print(" ".join(args[2:]), flush=True)
    t0 = time.time()
    subprocess.run(args, cwd=ROOT, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    print(f"  {time.time() - t0:.0f} s", flush=True)
    return time.time() - t0


def write_teacher_data(folder: Path) -> None:
    """The arithmetic task's train/test problems as chat records: the question, then "a + b = c"."""
    from rlkit.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(**TASK)
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        with open(folder / f"{split}.jsonl", "w") as fh:
            for p in task.problems(split):
                answer = f"{p['a']} {p['op']} {p['b']} = {p['answer']}"
                fh.write(json.dumps({"messages": [{"role": "user", "content": p["question"]}, {"role": "assistant", "content": answer}]}) + "\n")


def teacher_checkpoint() -> str:
    return lines(RUNS / "teacher_sft" / "checkpoints.jsonl")[-1]["checkpoint"]


def run_all() -> None:
    for seed in SEEDS:
        rlkit_train("recipe=prompt_distillation", f"seed={seed}", f"run_dir={RUNS / f'prompt_distillation/seed{seed}'}")
    data = RUNS / "teacher_data"
    write_teacher_data(data)
    if not (RUNS / "teacher_sft" / "checkpoints.jsonl").exists():
        rlkit_train(*TEACHER_SFT, f"data.train.path={data / 'train.jsonl'}", f"data.eval.path={data / 'test.jsonl'}", f"run_dir={RUNS / 'teacher_sft'}")
    teacher = teacher_checkpoint()
    for seed in SEEDS:
        for recipe in ("onpolicy_distill", "offpolicy_distill"):
            rlkit_train(f"recipe={recipe}", f"seed={seed}", f"train.teacher.checkpoint={teacher}", f"run_dir={RUNS / recipe / f'seed{seed}'}")


def at(metrics, step, key):
    for m in metrics:
        if m["step"] == step and key in m:
            return m[key]
    return None


def column(runs, step, key):
    return [v for m in runs if (v := at(m, step, key)) is not None]


def summarise() -> dict:
    out = {}
    pd = [lines(RUNS / "prompt_distillation" / f"seed{s}" / "metrics.jsonl") for s in SEEDS]
    pd = [m for m in pd if m]
    print(f"\n## prompt_distillation ({len(pd)} seeds)\n\n| metric | step 0 | step 4 (64 samples) | step 8 (128 samples) |\n|---|---|---|---|")
    out["prompt_distillation"] = {}
    for name, key in (("reverse KL to the teacher, per token (held-out)", "eval/reverse_kl"),
                      ("student greedy accuracy", "eval/greedy_accuracy"),
                      ("student sampled accuracy (T=1)", "eval/sampled_accuracy")):
        cols = [column(pd, s, key) for s in (0, 4, 8)]
        out["prompt_distillation"][key] = cols
        print(f"| {name} | " + " | ".join(fmt(c) for c in cols) + " |")
    teacher = column(pd, 0, "eval/teacher_greedy_accuracy")
    seconds = [sum(x.get("time/step_s", 0) + x.get("time/eval_s", 0) * (x["step"] == 8) for x in m) for m in pd]
    print(f"\nteacher (system prompt) greedy accuracy: {fmt(teacher)}; seconds per run: {fmt(seconds, 0)}")
    out["prompt_distillation"]["teacher_greedy_accuracy"] = teacher

    sft = lines(RUNS / "teacher_sft" / "metrics.jsonl")
    if sft:
        out["teacher_sft"] = {"eval_nll": [m.get("eval/nll") for m in sft if "eval/nll" in m]}
        print(f"\nteacher SFT: held-out NLL per answer token {out['teacher_sft']['eval_nll']}")
    for recipe in ("onpolicy_distill", "offpolicy_distill"):
        runs = [m for m in (lines(RUNS / recipe / f"seed{s}" / "metrics.jsonl") for s in SEEDS) if m]
        out[recipe] = {}
        print(f"\n## {recipe} ({len(runs)} seeds)\n\n| metric | step 0 | step 4 (64 samples) | step 8 (128 samples) |\n|---|---|---|---|")
        for name, key in (("student greedy accuracy", "eval/greedy_accuracy"),
                          ("student sampled accuracy (T=1)", "eval/sampled_accuracy"),
                          ("reverse KL to the teacher, per token", "eval/reverse_kl")):
            cols = [column(runs, s, key) for s in (0, 4, 8)]
            out[recipe][key] = cols
            print(f"| {name} | " + " | ".join(fmt(c) for c in cols) + " |")
        teacher_acc = column(runs, 0, "eval/teacher_greedy_accuracy")
        seconds = [sum(x.get("time/step_s", 0) + x.get("time/eval_s", 0) * (x["step"] == 8) for x in m) for m in runs]
        out[recipe]["teacher_greedy_accuracy"], out[recipe]["seconds"] = teacher_acc, seconds
        print(f"\nteacher greedy accuracy: {fmt(teacher_acc)}; seconds per run (steps + evals): {fmt(seconds, 0)}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--summarise", action="store_true")
    args = parser.parse_args()
    if not args.summarise:
        run_all()
    result = summarise()
    (Path(__file__).parent / "results.json").write_text(json.dumps(result, indent=1) + "\n")
