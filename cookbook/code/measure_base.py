"""Measure a model (base, or a checkpoint) on the code task: pass@1, reward variance per group, turn gains.

    python cookbook/code/measure_base.py --problems 40 --group 8 --max-tokens 160 --turns 2

Samples ``--group`` attempts (temperature ``--temperature``) at each of the first ``--problems``
problems of ``--split`` through the same rollout collector and environment as training, and
prints: pass@1 (sampled, on the final turn's hidden tests), the turn-1 pass@1 (hidden tests of
the first attempt), the fraction of groups whose rewards are not all equal (those are the only
groups GRPO learns from), the fraction with a code block, timeouts, tokens and wall time.
``--greedy`` adds the greedy pass@1. Writes one JSON line per run to ``--out`` if given.
"""

from __future__ import annotations

import argparse
import json
import time

import rlkit
from rlkit.rl.collect import RolloutPolicy, collect_groups
from rlkit.rl.eval import success
from rlkit.tasks.code import CodeTask
from rlkit.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--checkpoint", default=None, help="a sampler checkpoint id (local://...) instead of the base model")
    ap.add_argument("--dataset", default="mbpp")
    ap.add_argument("--split", default="train")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--shots", type=int, default=0)
    ap.add_argument("--prefill", default="```python\n")
    ap.add_argument("--stop", default="```")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--stop-on-pass", action="store_true", help="end the episode when turn 1 passes the public tests")
    ap.add_argument("--ids", default=None, help="comma-separated problem ids (instead of --start/--problems)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--per-problem", default=None, help="write each problem's id and successes (JSONL) here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    task = CodeTask(dataset=args.dataset, num_shots=args.shots, prefill=args.prefill, turns=args.turns,
                    stop_on_pass=args.stop_on_pass)
    problems = task.problems(args.split)[args.start: args.start + args.problems]
    if args.ids:
        by_id = {p["id"]: p for p in task.problems(args.split)}
        problems = [by_id[i] for i in args.ids.split(",")]
    service = rlkit.connect("local", precision=args.precision)
    if args.checkpoint:
        sampler = service.create_sampling_client(model_package_arn=args.checkpoint)
    else:
        sampler = service.create_sampling_client(base_model=args.model)
    tokenizer = sampler.get_tokenizer()
    stop = [args.stop] if args.stop else None
    policy = RolloutPolicy(max_turns=args.turns, timeout_s=120, max_context_tokens=8192)
    result = {k: v for k, v in vars(args).items() if k != "out"}
    t0 = time.perf_counter()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, stop=stop, seed=args.seed)
    groups = collect_groups(sampler, [task.env_group(p, tokenizer) for p in problems], args.group, params, policy,
                            concurrency=args.concurrency, seeds=[args.seed * 1000 + i for i in range(len(problems))])
    result["sample_seconds"] = round(time.perf_counter() - t0, 1)
    trajs = [(t, r) for g in groups for t, r in zip(g.trajectories, g.rewards)]
    n = max(len(trajs), 1)
    result["pass@1"] = sum(success(t, r) for t, r in trajs) / n
    result["turn1_pass@1"] = sum(t.metrics.get("turn1_all_passed", 0.0) for t, _ in trajs) / n if args.turns > 1 else result["pass@1"]
    result["reward_mean"] = sum(r for _, r in trajs) / n
    result["groups_with_variance"] = sum(g.has_variance for g in groups) / max(len(groups), 1)
    result["problems_solved_any"] = sum(any(success(t, r) for t, r in zip(g.trajectories, g.rewards)) for g in groups)
    result["has_code"] = sum(t.metrics.get("has_code", 0.0) for t, _ in trajs) / n
    result["timeout_fraction"] = sum(t.metrics.get("timeout_fraction", 0.0) for t, _ in trajs) / n
    result["truncated_frac"] = sum(any(x.stop_reason == "length" for x in t.transitions) for t, _ in trajs) / n
    result["decode_tokens"] = sum(g.decode_tokens for g in groups)
    result["prefill_tokens"] = sum(g.prefill_tokens for g in groups)
    result["reward_seconds"] = round(sum(g.reward_seconds for g in groups), 1)
    if args.greedy:
        t1 = time.perf_counter()
        greedy = collect_groups(sampler, [task.env_group(p, tokenizer) for p in problems], 1,
                                SamplingParams(max_tokens=args.max_tokens, temperature=0.0, stop=stop), policy, concurrency=args.concurrency)
        result["greedy_pass@1"] = sum(success(g.trajectories[0], g.rewards[0]) for g in greedy) / max(len(greedy), 1)
        result["greedy_seconds"] = round(time.perf_counter() - t1, 1)
    if args.per_problem:
        with open(args.per_problem, "a") as f:
            for p, g in zip(problems, groups):
                wins = [success(t, r) for t, r in zip(g.trajectories, g.rewards)]
                f.write(json.dumps({"id": p["id"], "wins": sum(wins), "n": len(wins)}) + "\n")
    example = groups[0].trajectories[0]
    print("example:", repr(tokenizer.decode(example.tokens[-600:])))
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    task.close()
    service.close()


if __name__ == "__main__":
    main()
