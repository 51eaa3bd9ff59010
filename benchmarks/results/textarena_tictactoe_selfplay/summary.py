"""The per-game numbers of `rlkit repro recipe=textarena_tictactoe_selfplay seeds=3 jobs=shared`
(cookbook/environments/README.md; report.md holds the repro's own table): each seed's held-out
evaluations, its training reward, invalid-move rate and moves per game per step, and mean [95% CI,
Student t] over the seeds of the first and last evaluation, with rlkit's own statistics (rlkit.stats).
Prints summary.txt:

    python benchmarks/results/textarena_tictactoe_selfplay/summary.py > summary.txt
"""

import json
from pathlib import Path

from rlkit.stats import summarize

HERE = Path(__file__).resolve().parent
KEYS = ("eval/greedy_accuracy", "eval/greedy/win", "eval/greedy/loss", "eval/greedy/draw", "eval/greedy/invalid_move",
        "eval/greedy/turns")


def main() -> None:
    evals = {}
    for seed in (0, 1, 2):
        rows = [json.loads(line) for line in (HERE / "rl" / f"seed_{seed}" / "metrics.jsonl").read_text().splitlines()]
        evals[seed] = [r for r in rows if "eval/greedy_accuracy" in r]
        for r in evals[seed]:
            print(seed, r["step"], {k: round(v, 3) for k, v in r.items() if k.startswith("eval/")})
        trained = [r for r in rows if "reward/mean" in r]
        print(seed, "train reward/mean", [round(r["reward/mean"], 2) for r in trained],
              "invalid", [round(r.get("reward/invalid_move", 0.0), 2) for r in trained],
              "moves", [round(r.get("reward/turns", 0.0), 2) for r in trained],
              "draw", [round(r.get("reward/draw", 0.0), 2) for r in trained])
    for key in KEYS:
        before = [evals[s][0][key] for s in evals]
        after = [evals[s][-1][key] for s in evals]
        change = summarize([b - a for a, b in zip(before, after)])
        print(key, "before", summarize(before), "after", summarize(after), "change", change,
              "at steps", [evals[s][-1]["step"] for s in evals])


if __name__ == "__main__":
    main()
