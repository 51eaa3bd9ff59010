"""A loop of your own, run as ``python my_loop.py``: peak memory and time of one training step,
side by side with the ``rlkit`` command and with HF + PEFT (issue 51 item 3).

    python benchmarks/plain_python_memory.py [--repeats 1] [--limit-vs-hf 0.35] [--shapes rl sft]

Every arm is the same user script (written to a temporary directory: ``import rlkit`` at its top,
``rlkit.connect("local", precision="fp32", ...)``, a warm-up ``forward_backward`` of one group, then
the timed step), each in a fresh process, launched as a user would:

- ``python my_step.py`` — plain python (since issue 51: on mimalloc from ``import rlkit``,
  ``rlkit/malloc_preload.py``), with ``RLKIT_ALLOCATOR=system`` for what it was before;
- ``rlkit run my_step.py`` — the ``rlkit`` command;
- with ``activation_checkpointing=false`` (unchecked, the fastest), ``auto`` (the default: the
  memory there is decides) and ``auto`` under ``memory_limit_gb`` = ``--limit-vs-hf`` x HF + PEFT's
  peak measured in the same run.

Shapes: the GSM8K-shaped RL step (64 rows: 8 groups x 8 completions of 60-120 tokens on a 200-token
shared prompt, PPO) and the 16 x 256 LoRA SFT step (``--shapes`` chooses). HF + PEFT is
``benchmarks/train_memory.py``'s arm (same maths, same token budget). Peaks are each process's
``ru_maxrss``; ratios are against HF + PEFT, and times against the unchecked plain-python arm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
RLKIT = Path(sys.executable).with_name("rlkit")

SCRIPT = """import rlkit  # at the top, as a user's script: plain python runs on the rlkit command's allocator
import json, resource, sys, time
sys.path.insert(0, {here!r})
from train_memory import batch
from rlkit.malloc_preload import active

shape, loss, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
svc = rlkit.connect("local", precision="fp32", device="cpu", **options)
trainer = svc.create_lora_training_client("smollm2-135m-instruct", rank=16, alpha=32)
data = batch(shape, 200, 120)
if loss == "cross_entropy":  # SFT: the batch's target tokens and weights only
    data = [type(d)(model_input=d.model_input, loss_fn_inputs={{k: d.loss_fn_inputs[k] for k in ("target_tokens", "weights")}})
            for d in data]
trainer.forward_backward(data[:8], loss).result()  # warm-up: one group
t0 = time.perf_counter()
trainer.forward_backward(data, loss).result()
seconds = time.perf_counter() - t0
layers = trainer._engine.checkpointed_layers
svc.close()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, seconds, f"{{min(layers)}}-{{max(layers)}}/{{trainer._engine.n_layers}}", active())
"""


def run(argv, env=None):
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if out.returncode:
        raise SystemExit(f"{' '.join(argv)}: exit {out.returncode}\n{out.stderr[-3000:]}")
    peak, seconds, layers, allocator = out.stdout.strip().splitlines()[-1].split()
    return float(peak), float(seconds), layers, allocator


def hf_arm(shape: str, loss: str):
    args = ["--shape", shape, "--prompt", "200", "--completion", "120", "--loss", loss, "--one", "2048", "fp32", "hf"]
    return run([sys.executable, str(HERE / "train_memory.py"), *args], {"RLKIT_ALLOCATOR": "system"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the rlkit arms (medians printed when > 1)")
    parser.add_argument("--limit-vs-hf", type=float, default=0.35, help="memory_limit_gb as a share of HF + PEFT's peak")
    parser.add_argument("--shapes", nargs="+", default=["rl", "sft"], choices=["rl", "sft"], help="which steps to measure")
    args = parser.parse_args()
    import psutil
    import torch

    from session_throughput import matmul_peak

    print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 1024**3:.0f} GiB "
          f"({psutil.virtual_memory().available / 1024**3:.1f} available), torch {torch.__version__}; matmul peak "
          f"{matmul_peak('float32') / 1e9:.0f} GFLOP/s fp32, {matmul_peak('bfloat16') / 1e9:.0f} bf16; precision fp32\n")
    workdir = Path(tempfile.mkdtemp(prefix="rlkit-plain-"))
    script = workdir / "my_step.py"
    script.write_text(SCRIPT.format(here=str(HERE)))
    shapes = [("rl", "ppo", "GSM8K-shaped RL step (64 x ~320 tokens, PPO)")] if "rl" in args.shapes else []
    if "sft" in args.shapes:
        shapes.append(("plain", "cross_entropy", "16 x 256 LoRA SFT step"))
    for shape, loss, title in shapes:
        hf_peak, hf_seconds, _, hf_alloc = hf_arm(shape, loss if loss != "cross_entropy" else "importance_sampling")
        limit = round(args.limit_vs_hf * hf_peak, 2)
        arms = [
            ("python my_step.py", "false", {"activation_checkpointing": "false"}, None),
            ("python my_step.py", "auto", {}, None),
            ("python my_step.py", f"auto, memory_limit_gb={limit}", {"memory_limit_gb": limit}, None),
            ("rlkit run my_step.py", "false", {"activation_checkpointing": "false"}, "rlkit"),
            ("rlkit run my_step.py", "auto", {}, "rlkit"),
            ("python my_step.py, RLKIT_ALLOCATOR=system", "false", {"activation_checkpointing": "false"}, "system"),
            ("python my_step.py, RLKIT_ALLOCATOR=system", "auto", {}, "system"),
        ]
        if shape == "plain":  # the SFT question: does auto run unchecked when memory is plentiful?
            arms = [a for a in arms if a[0] == "python my_step.py" and "memory_limit" not in a[1]]
        results = {}
        for _ in range(max(args.repeats, 1)):  # round by round: a slow minute of the machine hits every arm
            for name, setting, options, how in arms:
                argv = [str(script), shape, loss, json.dumps(options)]
                if how == "rlkit":
                    out = run([str(RLKIT), "run", *argv])
                else:
                    out = run([sys.executable, *argv], {"RLKIT_ALLOCATOR": "system"} if how == "system" else None)
                results.setdefault((name, setting), []).append(out)
        print(f"### {title}\n")
        print(f"HF + PEFT (glibc, as a user runs it): peak {hf_peak:.2f} GiB in {hf_seconds:.1f} s; the limit arm: "
              f"{args.limit_vs_hf} x that = {limit} GiB\n")
        print("| arm | activation_checkpointing | malloc | layers checkpointed | peak RSS, GiB | seconds | peak vs HF + PEFT | time vs plain python unchecked |")
        print("|---" * 8 + "|")
        reference = median(s for _, s, _, _ in results[("python my_step.py", "false")])
        for (name, setting), values in results.items():
            peak, seconds = median(v[0] for v in values), median(v[1] for v in values)
            each = ", ".join(f"{v[1]:.1f}" for v in values)
            print(f"| {name} | {setting} | {values[0][3]} | {values[0][2]} | {peak:.2f} | {seconds:.1f}"
                  + (f" ({each})" if len(values) > 1 else "") + f" | {peak / hf_peak:.2f}x | {seconds / reference:.2f}x |", flush=True)
        print()


if __name__ == "__main__":
    main()
