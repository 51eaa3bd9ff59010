"""Rollouts on 2 ranks, shared vs replicated, beside one process (issue 42 item 2): the same RL run
(``arithmetic_grpo`` on SmolLM2-135M, 8 groups x 8 samples, up to 48 new tokens, dynamic sampling
off, 3 steps) as

- ``one``: one process, ``backend.num_threads`` = all cores;
- ``shared``: ``backend.nproc=2``, one thread per rank — each rank rolls out half the groups and
  every rank gets all (``rlkit.rl.rank_rollouts``, today's code);
- ``replicated``: the same 2 ranks with every rank rolling out every group (the code before it:
  ``collect_groups`` told it runs alone), for the ratio.

Prints each arm's median ``time/rollout`` and ``time/step`` (steps 1..), the wall time, and whether
rewards and grad norms equal ``one``'s (rel 1e-5). On a CPU the ranks share the machine's cores, so
``shared`` can at best match ``one``; on GPUs each rank decodes on its own device.

    python benchmarks/ranks_rollouts.py
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARGS = ["recipe=arithmetic_grpo", "train.steps=3", "train.max_tokens=48", "train.curriculum.dynamic_sampling=false",
        "train.eval_every=100", "train.eval.problems=8", "train.checkpoint_every=100"]


def replicated_entry() -> None:
    """``rlkit`` with every rank rolling out every group (run by torchrun for the ``replicated`` arm)."""
    import rlkit.rl.collect as collect

    collect.ranks_sharing = lambda: 1
    sys.argv = ["rlkit", *sys.argv[2:]]
    runpy.run_module("rlkit", run_name="__main__")


def arm(name: str, run_dir: Path) -> dict:
    cores = os.cpu_count() or 1
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = {
        "one": [sys.executable, "-m", "rlkit", "train", *ARGS, f"backend.num_threads={cores}"],
        "shared": [sys.executable, "-m", "rlkit", "train", *ARGS, "backend.nproc=2", f"backend.num_threads={max(1, cores // 2)}"],
        "replicated": [*torchrun, __file__, "--replicated-entry", "train", *ARGS, f"backend.num_threads={max(1, cores // 2)}"],
    }[name] + [f"run_dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(cores if name == "one" else max(1, cores // 2))}
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"ranks_rollouts: {name} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/rollout" in r]
    print(f"# {name}: {wall:.0f} s", file=sys.stderr, flush=True)
    return {"wall": wall, "rollout": statistics.median(r["time/rollout"] for r in steps[1:]),
            "step": statistics.median(r["time/step"] for r in steps[1:]),
            "numbers": [(r.get("reward/mean"), r.get("train/grad_norm")) for r in steps]}


def same(a: list, b: list) -> bool:
    return all(abs(x - y) <= 1e-5 * max(abs(x), abs(y), 1e-12) for pa, pb in zip(a, b) for x, y in zip(pa, pb)) and len(a) == len(b)


def main() -> None:
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores")
    with tempfile.TemporaryDirectory() as tmp:
        got = {name: arm(name, Path(tmp) / name) for name in ("one", "shared", "replicated")}
    print("| arm | ranks x threads | time/rollout (median) | time/step (median) | wall | rewards, grad norms = one's |")
    print("|---|---|---|---|---|---|")
    cores = os.cpu_count() or 1
    for name, r in got.items():
        layout = f"1 x {cores}" if name == "one" else f"2 x {max(1, cores // 2)}"
        print(f"| {name} | {layout} | {r['rollout']:.2f} s | {r['step']:.2f} s | {r['wall']:.0f} s | {same(got['one']['numbers'], r['numbers'])} |")
    print(f"\nrollouts: shared / replicated = {got['shared']['rollout'] / got['replicated']['rollout']:.2f}x the time; "
          f"shared / one = {got['shared']['rollout'] / got['one']['rollout']:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--replicated-entry":
        replicated_entry()
    else:
        main()
