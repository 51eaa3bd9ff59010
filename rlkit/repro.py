"""``rlkit repro recipe=NAME seeds=N [out=DIR] [jobs=1|J|shared] [sft=true] [warm_start=sft] [compare=R1,R2]
[sft.KEY=V ...] [key=value ...]``: a recipe over seeds, with baselines, as a report (Markdown + JSON + PNG).

For each seed ``s = 0..N-1`` it runs, through the same CLI a user would use:

- **rl**: ``rlkit train recipe=NAME seed=s ...`` (held-out evaluation before the first step — the
  *no-training* baseline — and after the last);
- **sft** (RL recipes whose task has reference answers): the same recipe with ``loop=task_sft``,
  i.e. cross-entropy on the same problems' reference answers for the same number of steps;
  ``sft.KEY=VALUE`` overrides apply to this arm only (e.g. ``sft.train.steps=20``);
- with ``warm_start=sft`` the RL arm is **sft+rl** instead: RL starting from that seed's SFT
  checkpoint (``train.init_checkpoint``), so its *before* is the SFT-only model;
- **compare** arms: other recipes (e.g. the same task without tools) run for the same seeds, with
  none of the overrides (give them their own recipe).

``jobs=J`` runs up to J seeds at once (each seed's arms stay in order; each run gets
``OMP_NUM_THREADS = cpus // J`` unless you set it): on a small CPU, where one run's decode cannot
use every core, two one-thread runs finish sooner than two two-thread runs one after the other.
The runs are the same either way; only thread counts, and so fp32 rounding, differ.

``jobs=shared`` runs every seed's arms at once as runs of **one** local engine in this process
(:mod:`rlkit.thread_runs`): the base model is loaded once and one sampler decodes for every run,
instead of one process (and one model copy) a run. An arm that starts from another's checkpoint
(``warm_start=sft``) still waits for it. Each run's directory (``config.yaml``, ``metrics.jsonl``,
checkpoints, ``result.json``) is what ``rlkit train`` writes for it alone; the runs' console lines
are not shown (as with separate processes). Refused in one line, before anything runs, where a
run cannot share the engine: a backend other than ``local``, ``backend.nproc > 1``,
``backend.sampler=vllm``, ``logger=wandb`` (:func:`rlkit.thread_runs.check_shareable`).

**A killed repro continues**: rerun the same command with the same ``out=DIR`` (``out.../repro.json``
holds the request; a different request is refused, except more ``seeds=``, which **extends** it:
seeds 0..old-1 are read back and only the new seeds run). Runs that finished are read, not rerun; an
unfinished run resumes from its last checkpoint (``rlkit train`` into the same ``run_dir``). A
resumed run's wall time is the time its logged steps and evaluations took (from the ``time/*``
metrics in its ``metrics.jsonl``, :func:`logged_seconds`), marked in the report.

The report gives, per arm and metric (greedy accuracy, pass@k, and the lm-evaluation-harness scores
of a recipe that sets ``train.eval.harness``: ``harness/<task>/<metric>``), the per-seed values before and
after, their mean and 95% confidence interval (Student t), the per-seed improvement, wall time and
tokens (prefill, sampled, trained), and the machine it ran on. Every number comes from the runs'
``metrics.jsonl``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from rlkit import malloc_preload
from rlkit.errors import ConfigError
from rlkit.lifetime import spawn
from rlkit.runs import last_checkpoint
from rlkit.stats import summarize

METRICS = ("eval/greedy_accuracy", "eval/pass@1_sampled")
TOKEN_KEYS = ("tokens/prefill", "tokens/sampled", "tokens/trained")
SHARED = "shared"  # jobs=shared: every run on one engine in this process (rlkit.thread_runs)


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
        "allocator": malloc_preload.active(),  # the runs are `rlkit train` processes: they preload it too
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
    harness_before, harness_after = harness_values(lines)
    return {
        "before": {**{k: before.get(k) for k in keys}, **harness_before},
        "after": {**{k: after.get(k) for k in keys}, **harness_after},
        "steps": max(m["step"] for m in lines),
        "tokens": tokens,
    }


def harness_values(lines: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The lm-evaluation-harness scores a run logged (``train.eval.harness``), before training
    (``harness/step == 0``) and at the end (the largest ``harness/step``): ``harness/<task>/<metric>``,
    their stderr and lm-eval's ``sample_len`` left out; empty without them."""
    measured = [m for m in lines if "harness/step" in m]
    if not measured:
        return {}, {}
    first = next((m for m in measured if m["harness/step"] == 0), None)
    last = max(measured, key=lambda m: m["harness/step"])
    keys = sorted(k for k in last if k.startswith("harness/") and k != "harness/step"
                  and not k.endswith("_stderr") and not k.endswith("/sample_len"))
    return ({k: first.get(k) for k in keys} if first else {}), {k: last[k] for k in keys}


def metric_label(key: str) -> str:
    """A metric's name in the report: ``eval/`` dropped (``greedy_accuracy``), harness metrics whole."""
    return key[len("eval/"):] if key.startswith("eval/") else key


REQUEST = "repro.json"


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that logged its final evaluation (a metrics line at
    ``step == train.steps``, after the final checkpoint; see :mod:`rlkit.runs`)."""
    import yaml

    config, metrics = run_dir / "config.yaml", run_dir / "metrics.jsonl"
    if not (config.is_file() and metrics.is_file()):
        return False
    steps = ((yaml.safe_load(config.read_text()) or {}).get("train") or {}).get("steps")
    for line in metrics.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("step") == steps and any(k.startswith("eval/") for k in record):
            return True
    return False


def logged_seconds(run_dir: Path) -> float:
    """The time a run's logged steps and evaluations took: each step line's ``time/step`` (which
    includes an evaluation made at that step), and ``time/eval`` of the final evaluation's line."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return float(sum(m.get("time/step", m.get("time/step_s", m.get("time/eval", 0.0))) for m in lines))


def claim_out(out: Path, request: Dict[str, Any], log) -> bool:
    """Start a repro in ``out``, or continue the one it holds (same request). Returns whether it
    continues one; refuses a non-empty ``out`` that holds another request or no repro. The one
    difference allowed is more seeds: the finished seeds are reused and only the new ones run."""
    from rlkit.runs import atomic_write

    path = out / REQUEST
    if out.exists() and any(out.iterdir()):
        if not path.is_file():
            raise ConfigError(f"out={out} already exists and is not empty (no {REQUEST}); choose another out=")
        saved = json.loads(path.read_text())
        diff = sorted(k for k in set(saved) | set(request) if saved.get(k) != request.get(k))
        if diff == ["seeds"] and request["seeds"] > saved["seeds"]:
            log(f"extending the repro in {out} from {saved['seeds']} to {request['seeds']} seeds "
                f"(seeds 0-{saved['seeds'] - 1} are reused)")
            atomic_write(path, json.dumps(request, indent=2) + "\n")
            return True
        if diff:
            fewer = " (fewer seeds than it holds)" if diff == ["seeds"] else ""
            raise ConfigError(f"out={out} already exists and holds a repro of a different request "
                              f"({', '.join(diff)} differ{fewer}); choose another out=, or rerun that repro's command "
                              "to continue it (with more seeds= to extend it)")
        log(f"continuing the repro in {out}")
        return True
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(request, indent=2) + "\n")
    return False


def _run(args: List[str], run_dir: Path, log, env: Optional[Dict[str, str]] = None, resuming: bool = False) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "rlkit", "train", *args, f"run_dir={run_dir}"]
    log(f"$ rlkit train {' '.join(args)} run_dir={run_dir}" + ("   # resumes" if resuming else ""))
    with spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) as proc:  # dies with this process
        try:
            _, stderr = proc.communicate()
        except BaseException:
            proc.kill()
            raise
    if proc.returncode:
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        raise ConfigError(f"run {run_dir} failed (exit {proc.returncode}): {tail}")
    return time.perf_counter() - t0


def _run_shared(args: List[str], run_dir: Path, log, resuming: bool = False) -> float:
    """:func:`_run` as a run on this thread of the shared engine (:func:`run_in_thread`)."""
    t0 = time.perf_counter()
    log(f"$ rlkit train {' '.join(args)} run_dir={run_dir}   # in this process" + (", resumes" if resuming else ""))
    run_in_thread(args, run_dir)
    return time.perf_counter() - t0


def run_in_thread(overrides: Sequence[str], run_dir: Path) -> None:
    """``rlkit train *overrides run_dir=RUN_DIR`` as a run on this thread (inside
    :func:`rlkit.thread_runs.shared_runs`): the same config, run directory and ``result.json``, its
    console output discarded. A failed run raises one :class:`ConfigError` line naming ``run_dir``."""
    from rlkit.composition import compose
    from rlkit.sweep.job import one_line, run_job
    from rlkit.thread_runs import COMPOSE_LOCK, thread_run

    overrides = [*overrides, f"run_dir={run_dir}"]
    try:
        with thread_run(console="discard"):
            with COMPOSE_LOCK:
                cfg = compose(overrides)
            run_job(cfg, Path(run_dir), overrides, job=None)
    except Exception as exc:  # noqa: BLE001 - one line naming the run, as a failed run process gets
        raise ConfigError(f"run {run_dir} failed: {one_line(exc)}") from None


def _shared_chains(arms: Dict[str, Tuple[str, List[str], Optional[str]]], seeds: int,
                   one_run: Callable[[str, int], Dict[str, Any]]) -> List[Dict[str, Dict[str, Any]]]:
    """``jobs=shared``: every seed's arms at once on one shared engine, each arm that starts from
    another's checkpoint right after it; ``[seed][arm] -> one_run(arm, seed)``. A failed run does
    not stop the others (its error is raised once they end); a Ctrl-C stops them all
    (:func:`rlkit.thread_runs.run_threads`)."""
    from rlkit.thread_runs import run_threads, shared_runs

    chains = [[arm] + [a for a, (_, _, start) in arms.items() if start == arm]
              for arm, (_, _, start) in arms.items() if start is None]
    results: List[Dict[str, Dict[str, Any]]] = [{} for _ in range(seeds)]

    def chain(s: int, names: List[str]) -> None:
        for arm in names:
            results[s][arm] = one_run(arm, s)

    with shared_runs():
        run_threads([functools.partial(chain, s, names) for s in range(seeds) for names in chains])
    return [{arm: results[s][arm] for arm in arms} for s in range(seeds)]


def repro(recipe: str, seeds: int, out: Path, overrides: List[str], *, sft: bool = True,
          warm_start: Optional[str] = None, compare: Sequence[str] = (), sft_overrides: Sequence[str] = (),
          jobs: Union[int, str] = 1, log=print) -> Dict[str, Any]:
    """Run the repro (see the module docstring); ``jobs``: seeds at once, or ``"shared"``."""
    from rlkit.composition import compose

    shared = jobs == SHARED
    cfg = compose([f"recipe={recipe}", *overrides])
    if cfg.loop != "rl":
        raise ConfigError(f"repro compares RL with baselines; recipe {recipe!r} runs loop {cfg.loop!r}")
    if seeds < 2:
        raise ConfigError("seeds must be >= 2 for a confidence interval")
    if warm_start not in (None, "sft"):
        raise ConfigError(f"warm_start={warm_start!r}: the only warm start is 'sft'")
    for other in compare:
        if compose([f"recipe={other}"]).loop != "rl":
            raise ConfigError(f"compare={other}: repro compares RL recipes")
    # arm -> (recipe, overrides, the arm whose checkpoint it starts from)
    arms: Dict[str, Tuple[str, List[str], Optional[str]]] = {}
    has_sft = False
    if sft or warm_start:
        from omegaconf import OmegaConf

        from rlkit.tasks import build_task

        task = build_task(OmegaConf.to_container(cfg.train.task, resolve=True))
        task.close()
        has_sft = task.has_references
        if not has_sft:
            if warm_start:
                raise ConfigError(f"warm_start=sft: task {task.name} has no reference answers to train on")
            log(f"note: task {task.name} has no reference answers; no SFT baseline")
    sft_arm = (recipe, [*overrides, "loop=task_sft", *sft_overrides], None)
    if warm_start:  # the SFT runs first: RL starts from their checkpoints
        arms["sft"], arms["sft+rl"] = sft_arm, (recipe, list(overrides), "sft")
    else:
        arms["rl"] = (recipe, list(overrides), None)
        if has_sft:
            arms["sft"] = sft_arm
    for other in compare:
        arms[other] = (other, [], None)
    if shared:  # every arm's config, before anything is written
        from rlkit.thread_runs import check_shareable

        for arm_recipe, extra, _ in arms.values():
            check_shareable(compose([f"recipe={arm_recipe}", *extra]), "jobs=shared")
    request = {"recipe": recipe, "seeds": seeds, "overrides": list(overrides), "sft": sft, "warm_start": warm_start,
               "compare": list(compare), "sft_overrides": list(sft_overrides)}
    claim_out(out, request, log)
    results: Dict[str, Any] = {"recipe": recipe, "seeds": seeds, "overrides": overrides, "warm_start": warm_start,
                               "compare": list(compare), "machine": machine(), "arms": {}}
    progress = {"done": 0, "total": len(arms) * seeds}
    lock = threading.Lock()

    def say(message: str) -> None:
        with lock:
            log(message)

    def one_run(arm: str, s: int) -> Dict[str, Any]:
        arm_recipe, extra, start_from = arms[arm]
        run_dir = out / arm.replace("+", "_") / f"seed_{s}"
        walls = out / arm.replace("+", "_") / f"seed_{s}.wall_s"
        if finished(run_dir):
            say(f"{arm} seed {s}: finished earlier, read from {run_dir}")
        else:
            say(f"{arm} seed {s}: starting")
            init = [f"train.init_checkpoint={last_checkpoint(out / start_from.replace('+', '_') / f'seed_{s}', purpose='to warm-start from')}"] if start_from else []
            resumed = run_dir.is_dir() and any(run_dir.iterdir())
            args = [f"recipe={arm_recipe}", f"seed={s}", *extra, *init]
            wall = _run_shared(args, run_dir, say, resuming=resumed) if shared else _run(args, run_dir, say, env=env, resuming=resumed)
            walls.write_text(json.dumps({"wall_s": wall, "resumed": resumed}))
        with lock:
            progress["done"] += 1
            log(f"[{progress['done']}/{progress['total']}] {arm} seed {s} done")
        timing = json.loads(walls.read_text()) if walls.is_file() else {"resumed": True}
        if timing["resumed"]:  # the killed attempt's time is unknown: what its logged work took
            timing = {"wall_s": logged_seconds(run_dir), "resumed": True}
        return {"seed": s, **timing, **read_run(run_dir)}

    def seed_chain(s: int) -> Dict[str, Dict[str, Any]]:  # a seed's arms in order (sft+rl needs sft's checkpoint)
        return {arm: one_run(arm, s) for arm in arms}

    env = None
    if shared:
        chains = _shared_chains(arms, seeds, one_run)
    else:
        if jobs > 1 and "OMP_NUM_THREADS" not in os.environ:  # concurrent runs share the cores
            env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // int(jobs)))}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
            chains = list(pool.map(seed_chain, range(seeds)))
    for arm, (arm_recipe, _, _) in arms.items():
        per_seed = [chains[s][arm] for s in range(seeds)]
        results["arms"][arm] = {"recipe": arm_recipe, "runs": per_seed, "summary": _summaries(per_seed)}
    (out / "report.json").write_text(json.dumps(results, indent=2))
    (out / "report.md").write_text(render_markdown(results))
    plot(results, out / "report.png")
    return results


def _summaries(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key in runs[0]["after"]:
        after = [r["after"][key] for r in runs if r["after"].get(key) is not None]
        if not after:  # a metric the recipe does not measure (pass@1_sampled with train.eval.samples=0)
            continue
        before = [r["before"][key] for r in runs if r["before"].get(key) is not None]
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
        f"({m['torch_threads']} threads), GPU: {m['gpu'] or 'none'}, malloc: {m.get('allocator', 'system')}; rlkit {m['rlkit_commit']}.",
        f"Overrides: `{' '.join(results['overrides']) or '(none)'}`. Values: mean [95% CI, Student t] over seeds.",
        "",
        "| arm | metric | before (no training) | after | improvement |",
        "|---|---|---|---|---|",
    ]
    for arm, data in results["arms"].items():
        for key, s in data["summary"].items():
            if key.startswith(("eval/", "harness/")):
                lines.append(f"| {arm} | {metric_label(key)} | {_fmt(s['before'])} | {_fmt(s['after'])} | {_fmt(s['improvement'])} |")
    if results.get("warm_start"):
        lines += ["", "sft+rl starts from each seed's sft checkpoint: its *before* is the SFT-only model, and its wall "
                  "time excludes the SFT run (add the sft arm's)."]
    lines += ["", "| arm | wall time per run (s) | prefill tokens | sampled tokens | trained tokens |", "|---|---|---|---|---|"]
    for arm, data in results["arms"].items():
        s = data["summary"]
        lines.append(f"| {arm} | {s['wall_s']['mean']:.0f} | {s['tokens/prefill']['mean']:.0f} | {s['tokens/sampled']['mean']:.0f} | {s['tokens/trained']['mean']:.0f} |")
    first = [k for k, v in next(iter(results["arms"].values()))["runs"][0]["after"].items() if v is not None]
    header = " | ".join(f"{metric_label(k)} before → after" for k in first)
    lines += ["", "Per seed:", "", f"| arm | seed | {header} | wall s |",
              "|---|---|" + "---|" * len(first) + "---|"]
    for arm, data in results["arms"].items():
        for r in data["runs"]:
            cells = [f"{r['before'][k]:.3f} → {r['after'][k]:.3f}" if r["before"].get(k) is not None
                     else f"{r['after'][k]:.3f}" if r["after"].get(k) is not None else "—" for k in first]
            mark = "*" if r.get("resumed") else ""
            lines.append(f"| {arm} | {r['seed']} | " + " | ".join(cells) + f" | {r['wall_s']:.0f}{mark} |")
    if any(r.get("resumed") for data in results["arms"].values() for r in data["runs"]):
        lines += ["", "\\* resumed after the repro was stopped: the time its logged steps and evaluations took "
                  "(their `time/*` metrics), without process start-up."]
    return "\n".join(lines) + "\n"


def plot(results: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in next(iter(results["arms"].values()))["summary"] if k.startswith(("eval/", "harness/"))]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        labels, means, errs = [], [], []
        for k, (arm, data) in enumerate(results["arms"].items()):
            for when in ("before", "after"):
                s = data["summary"].get(key, {}).get(when)
                if s is None or (k > 0 and when == "before" and arm not in results.get("compare", [])):
                    continue
                labels.append(f"{arm}: no training" if when == "before" else arm)
                means.append(s["mean"])
                errs.append(0.0 if s["ci95_high"] is None else s["ci95_high"] - s["mean"])
        palette = ["#999999", "#3b7dd8", "#e08a2c", "#5aa05a", "#bbbbbb", "#9b59b6"]
        ax.bar(labels, means, yerr=errs, capsize=4, color=[palette[i % len(palette)] for i in range(len(labels))])
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_title(metric_label(key))
        ax.set_ylim(0, 1)
    fig.suptitle(f"{results['recipe']}: mean and 95% CI over {results['seeds']} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def repro_command(argv: List[str]) -> int:
    """rlkit repro recipe=NAME seeds=N [out=DIR] [jobs=J|shared] [sft=bool] [warm_start=sft] [compare=R,...] [sft.K=V] [k=v ...]"""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    opts = {"seeds": "3", "out": None, "sft": "true", "warm_start": None, "compare": "", "jobs": "1"}
    overrides, sft_overrides = [], []
    recipe = None
    for arg in argv:
        key, _, value = arg.partition("=")
        if key == "recipe":
            recipe = value
        elif key in opts:
            opts[key] = value
        elif key.startswith("sft."):
            sft_overrides.append(arg[4:])
        else:
            overrides.append(arg)
    if not recipe:
        raise ConfigError("repro needs recipe=NAME")
    try:
        seeds = int(opts["seeds"])
    except ValueError:
        raise ConfigError(f"seeds={opts['seeds']!r} is not an integer") from None
    if opts["jobs"] != SHARED and (not opts["jobs"].isdigit() or int(opts["jobs"]) < 1):
        raise ConfigError(f"jobs={opts['jobs']!r}: expected a positive integer (seeds run at once) or "
                          f"{SHARED} (every run at once on one engine in this process)")
    out = Path(opts["out"] or f"runs/repro/{recipe}-{time.strftime('%Y%m%d-%H%M%S')}")
    compare = [c for c in (opts["compare"] or "").split(",") if c]
    results = repro(recipe, seeds, out, overrides, sft=opts["sft"].lower() in ("1", "true", "yes"),
                    warm_start=opts["warm_start"], compare=compare, sft_overrides=sft_overrides,
                    jobs=opts["jobs"] if opts["jobs"] == SHARED else int(opts["jobs"]), log=lambda m: print(m, file=sys.stderr))
    print(render_markdown(results))
    print(f"report: {out / 'report.md'} (also report.json, report.png)")
    return 0
