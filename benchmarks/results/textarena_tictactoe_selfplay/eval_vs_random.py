"""A second yardstick for the TicTacToe self-play repro: the same 32 held-out games, played greedily
against TextArena's scripted **random** opponent (a uniform choice among the legal moves) instead of
the frozen base model, whose greedy first move is never legal (cookbook/environments/README.md).

Evaluates the base model once (its greedy games are the same for every seed: the held-out games and
the opponent's draws depend on the task's seed, not the run's) and each seed's last checkpoint, with
the recipe's own evaluation (``rlkit.rl.eval.evaluate``: the task, its rollout policy, greedy,
``train.eval.max_tokens``), and prints mean [95% CI, Student t] over the seeds (``rlkit.stats``)::

    python benchmarks/results/textarena_tictactoe_selfplay/eval_vs_random.py /tmp/t52/ttt_repro/rl > vs_random.txt
"""

import json
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

import rlkit
from rlkit.harness.weights import resolve_weights
from rlkit.rl.collect import RolloutPolicy
from rlkit.rl.eval import evaluate
from rlkit.stats import summarize
from rlkit.tasks.base import build_task

KEYS = ("eval/greedy_accuracy", "eval/greedy/win", "eval/greedy/loss", "eval/greedy/draw", "eval/greedy/invalid_move",
        "eval/greedy/turns")


def play(service, tokenizer, cfg, checkpoint: str) -> dict:
    """The recipe's held-out evaluation against ``random`` on ``checkpoint`` ("" = the base model)."""
    spec = {**OmegaConf.to_container(cfg.train.task, resolve=True), "eval_opponent": "random"}
    task = build_task(spec)
    task.attach(service, cfg.model.base_model)
    sampler = (service.create_sampling_client(model_package_arn=checkpoint) if checkpoint
               else service.create_sampling_client(base_model=cfg.model.base_model))
    problems = task.problems("test")[: cfg.train.eval.problems]
    rollout = RolloutPolicy(**OmegaConf.to_container(cfg.train.rollout, resolve=True))
    t0 = time.perf_counter()
    metrics = evaluate(sampler, task, problems, tokenizer, max_tokens=cfg.train.eval.max_tokens or cfg.train.max_tokens,
                       pass_k=0, stop=list(cfg.train.stop), seed=None, policy=rollout, concurrency=len(problems))
    task.close()
    print(f"  {checkpoint or 'base model'}: {len(problems)} games in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return metrics


def main(runs: Path) -> None:
    seeds = sorted((p for p in runs.glob("seed_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))
    cfg = OmegaConf.load(seeds[0] / "config.yaml")
    service = rlkit.connect("local", precision=cfg.backend.precision)
    tokenizer = service.create_sampling_client(base_model=cfg.model.base_model).get_tokenizer()
    base = play(service, tokenizer, cfg, "")
    print("base model vs random:", json.dumps({k: round(base[k], 3) for k in KEYS}))
    after = {}
    for run in seeds:
        weights = resolve_weights(run=str(run))
        after[run.name] = play(service, tokenizer, OmegaConf.load(run / "config.yaml"), weights.checkpoint)
        print(f"{run.name} step {weights.step} vs random:", json.dumps({k: round(after[run.name][k], 3) for k in KEYS}))
    print(f"\nmean [95% CI, Student t] over {len(after)} seeds, 32 greedy games against the random opponent")
    for key in KEYS:
        values = [m[key] for m in after.values()]
        print(f"{key}: base {base[key]:.3f}, after {summarize(values)}, change {summarize([v - base[key] for v in values])}")
    service.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
