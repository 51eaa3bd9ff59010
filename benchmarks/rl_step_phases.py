"""Where an RL step's wall time goes, for arithmetic_grpo on the embedded default model.

    python benchmarks/rl_step_phases.py [--steps 4] [--extra key=value ...]

Runs the recipe twice through the real CLI — synchronous (``max_staleness=0``) and sampling one
step ahead (``max_staleness=1``, pacing) — and prints the per-step time split by phase from the
runs' ``metrics.jsonl``: rollout (sampling + reward), of which reward CPU time, training
(forward_backward + optim_step), weight sync (save adapter -> sampler), checkpoint, and the loop's
own overhead (step time minus all of these; target < 5%). ``wait_rollout`` is the time the loop
waited for its batch: equal to ``rollout`` when synchronous, smaller when sampling overlaps training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PHASES = ("time/wait_rollout", "time/rollout", "time/reward_cpu", "time/train", "time/sync_weights", "time/checkpoint", "time/loop_overhead")


def run(tmp: Path, name: str, steps: int, extra: list[str]) -> list[dict]:
    run_dir = tmp / name
    args = [sys.executable, "-m", "rlkit", "train", "recipe=arithmetic_grpo", f"run_dir={run_dir}", f"train.steps={steps}",
            "train.eval.problems=0", "train.eval_every=0", "train.checkpoint_every=0", *extra]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"time/step"' in x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--extra", nargs="*", default=[])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "sync": run(Path(tmp), "sync", args.steps, args.extra),
            "async (max_staleness=1)": run(Path(tmp), "async", args.steps, ["train.max_staleness=1", *args.extra]),
        }
    print("\nseconds per step (median over steps after the first)\n")
    print("| schedule | step | " + " | ".join(p.split("/")[1] for p in PHASES) + " | overhead share |")
    print("|---|---|" + "---|" * len(PHASES) + "---|")
    for name, metrics in rows.items():
        body = metrics[1:] or metrics
        step = statistics.median(m["time/step"] for m in body)
        cells = [statistics.median(m.get(p, 0.0) for m in body) for p in PHASES]
        print(f"| {name} | {step:.2f} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {cells[-1] / step:.1%} |")


if __name__ == "__main__":
    main()
