"""``rlkit repro recipe=NAME seeds=N [out=DIR] [sft=true] [key=value ...]``: a recipe over seeds,
with baselines, as a report (Markdown + JSON + PNG).

For each seed ``s = 0..N-1`` it runs, through the same CLI a user would use:

- **rl**: ``rlkit train recipe=NAME seed=s ...`` (held-out evaluation before the first step — the
  *no-training* baseline — and after the last);
- **sft** (RL recipes whose task has reference answers): the same recipe with ``loop=task_sft``,
  i.e. cross-entropy on the same problems' reference answers for the same number of steps.

The report gives, per arm and metric (greedy accuracy, pass@k), the per-seed values before and
after, their mean and 95% confidence interval (Student t), the per-seed improvement, wall time and
tokens (prefill, sampled, trained), and the machine it ran on. Every number comes from the runs'
``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from rlkit.errors import ConfigError
from rlkit.stats import summarize

METRICS = ("eval/greedy_accuracy",)
TOKEN_KEYS = ("tokens/prefill", "tokens/sampled", "tokens/trained")


def machine() -> Dict[str, Any]:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "rlkit_commit": commit.stdout.strip() or None,
    }


def read_run(run_dir: Path) -> Dict[str, Any]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [m for m in lines if any(k.startswith("eval/") for k in m)]
    if not evals:
        raise ConfigError(f"{run_dir}: the run logged no evaluation (set train.eval.problems > 0)")
    before, after = evals[0], evals[-1]
    keys = sorted({k for k in after if k.startswith("eval/pass@") and not k.endswith("_sampled")} | set(METRICS))
    tokens = {k: sum(m.get(k, 0.0) for m in lines) for k in TOKEN_KEYS}
    return {
        "before": {k: before.get(k) for k in keys},
        "after": {k: after.get(k) for k in keys},
        "steps": max(m["step"] for m in lines),
        "tokens": tokens,
    }


def _run(args: List[str], run_dir: Path, log) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "rlkit", "train", *args, f"run_dir={run_dir}"]
    log(f"$ rlkit train {' '.join(args)} run_dir={run_dir}")
    out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if out.returncode:
        tail = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
        raise ConfigError(f"run {run_dir} failed (exit {out.returncode}): {tail}")
    return time.perf_counter() - t0


def repro(recipe: str, seeds: int, out: Path, overrides: List[str], *, sft: bool = True, log=print) -> Dict[str, Any]:
    from rlkit.cli import compose

    cfg = compose([f"recipe={recipe}", *overrides])
    if cfg.loop != "rl":
        raise ConfigError(f"repro compares RL with baselines; recipe {recipe!r} runs loop {cfg.loop!r}")
    if seeds < 2:
        raise ConfigError("seeds must be >= 2 for a confidence interval")
    arms = {"rl": []}
    if sft:
        from rlkit.tasks import build_task
        from omegaconf import OmegaConf

        task = build_task(OmegaConf.to_container(cfg.train.task, resolve=True))
        task.close()
        if task.has_references:
            arms["sft"] = ["loop=task_sft"]
        else:
            log(f"note: task {task.name} has no reference answers; no SFT baseline")
    out.mkdir(parents=True, exist_ok=True)
    results: Dict[str, Any] = {"recipe": recipe, "seeds": seeds, "overrides": overrides, "machine": machine(), "arms": {}}
    for arm, extra in arms.items():
        per_seed = []
        for s in range(seeds):
            run_dir = out / arm / f"seed_{s}"
            wall = _run([f"recipe={recipe}", f"seed={s}", *overrides, *extra], run_dir, log)
            per_seed.append({"seed": s, "wall_s": wall, **read_run(run_dir)})
        results["arms"][arm] = {"runs": per_seed, "summary": _summaries(per_seed)}
    (out / "report.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(render_markdown(results))
    plot(results, out / "report.png")
    return results


def _summaries(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key in runs[0]["after"]:
        before = [r["before"][key] for r in runs if r["before"].get(key) is not None]
        after = [r["after"][key] for r in runs]
        out[key] = {
            "before": summarize(before).as_dict() if before else None,
            "after": summarize(after).as_dict(),
            "improvement": summarize([a - b for a, b in zip(after, before)]).as_dict() if len(before) == len(after) else None,
        }
    out["wall_s"] = summarize([r["wall_s"] for r in runs]).as_dict()
    for key in TOKEN_KEYS:
        out[key] = summarize([r["tokens"][key] for r in runs]).as_dict()
    return out


def _fmt(s: Optional[Dict[str, Any]]) -> str:
    if not s:
        return "—"
    if s.get("ci95_low") is None:
        return f"{s['mean']:.3f}"
    return f"{s['mean']:.3f} [{s['ci95_low']:.3f}, {s['ci95_high']:.3f}]"


def render_markdown(results: Dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"# repro: {results['recipe']} over {results['seeds']} seeds",
        "",
        f"Machine: {m['processor']}, {m['cpus']} CPUs, {m['platform']}, Python {m['python']}, torch {m['torch']} "
        f"({m['torch_threads']} threads), GPU: {m['gpu'] or 'none'}; rlkit {m['rlkit_commit']}.",
        f"Overrides: `{' '.join(results['overrides']) or '(none)'}`. Values: mean [95% CI, Student t] over seeds.",
        "",
        "| arm | metric | before (no training) | after | improvement |",
        "|---|---|---|---|---|",
    ]
    for arm, data in results["arms"].items():
        for key, s in data["summary"].items():
            if key.startswith("eval/"):
                lines.append(f"| {arm} | {key[5:]} | {_fmt(s['before'])} | {_fmt(s['after'])} | {_fmt(s['improvement'])} |")
    lines += ["", "| arm | wall time per run (s) | prefill tokens | sampled tokens | trained tokens |", "|---|---|---|---|---|"]
    for arm, data in results["arms"].items():
        s = data["summary"]
        lines.append(f"| {arm} | {s['wall_s']['mean']:.0f} | {s['tokens/prefill']['mean']:.0f} | {s['tokens/sampled']['mean']:.0f} | {s['tokens/trained']['mean']:.0f} |")
    lines += ["", "Per seed:", "", "| arm | seed | " + " | ".join(f"{k[5:]} before → after" for k in results["arms"]["rl"]["runs"][0]["after"]) + " | wall s |",
              "|---|---|" + "---|" * len(results["arms"]["rl"]["runs"][0]["after"]) + "---|"]
    for arm, data in results["arms"].items():
        for r in data["runs"]:
            cells = [f"{r['before'][k]:.3f} → {r['after'][k]:.3f}" if r["before"].get(k) is not None else f"{r['after'][k]:.3f}" for k in r["after"]]
            lines.append(f"| {arm} | {r['seed']} | " + " | ".join(cells) + f" | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(results: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(results["arms"]["rl"]["summary"])
    keys = [k for k in keys if k.startswith("eval/")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        labels, means, errs = [], [], []
        for arm, data in results["arms"].items():
            for when in ("before", "after"):
                s = data["summary"][key][when]
                if s is None or (arm != "rl" and when == "before"):
                    continue
                labels.append("no training" if when == "before" else arm)
                means.append(s["mean"])
                errs.append(0.0 if s["ci95_high"] is None else s["ci95_high"] - s["mean"])
        ax.bar(labels, means, yerr=errs, capsize=4, color=["#999999", "#3b7dd8", "#e08a2c"][: len(labels)])
        ax.set_title(key[5:])
        ax.set_ylim(0, 1)
    fig.suptitle(f"{results['recipe']}: mean and 95% CI over {results['seeds']} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def repro_command(argv: List[str]) -> int:
    """rlkit repro recipe=NAME seeds=N [out=DIR] [sft=true|false] [key=value ...]"""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    opts = {"seeds": "3", "out": None, "sft": "true"}
    overrides = []
    recipe = None
    for arg in argv:
        key, _, value = arg.partition("=")
        if key == "recipe":
            recipe = value
        elif key in opts:
            opts[key] = value
        else:
            overrides.append(arg)
    if not recipe:
        raise ConfigError("repro needs recipe=NAME")
    try:
        seeds = int(opts["seeds"])
    except ValueError:
        raise ConfigError(f"seeds={opts['seeds']!r} is not an integer") from None
    out = Path(opts["out"] or f"runs/repro/{recipe}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out={out} already exists and is not empty; choose another out=")
    results = repro(recipe, seeds, out, overrides, sft=opts["sft"].lower() in ("1", "true", "yes"), log=lambda m: print(m, file=sys.stderr))
    print(render_markdown(results))
    print(f"report: {out / 'report.md'} (also report.json, report.png)")
    return 0
