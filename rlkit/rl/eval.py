"""Held-out evaluation of a policy: greedy accuracy and pass@k.

``success`` of a trajectory is its reward's ``correct`` / ``*/correct`` / ``all_passed`` metric
when present, else ``reward >= 1``. pass@k uses the unbiased estimator of Chen et al. 2021
(arXiv:2107.03374) with n = k samples, i.e. 1 if any of the k samples succeeds.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from rlkit.rl.collect import RolloutPolicy, collect_groups
from rlkit.rl.env import Trajectory
from rlkit.types import SamplingParams


def success(trajectory: Trajectory, reward: float) -> bool:
    metrics = trajectory.metrics
    for key in ("correct", "all_passed"):
        for name, value in metrics.items():
            if name == key or name.endswith("/" + key):
                return bool(value)
    return reward >= 1.0


def problem_seeds(seed: int, n: int) -> List[int]:
    """One sampling seed per problem (the collector derives one per turn and env from it). A single
    seed for every request would give every problem — and every env's later turns — the same
    random draws, so pass@k would measure one draw sequence, not n problems."""
    return [(seed * 1_000_003 + 7_919 * (i + 1)) % 2**31 for i in range(n)]


def evaluate(
    sampling_client: Any,
    task: Any,
    problems: Sequence[Any],
    tokenizer: Any,
    *,
    max_tokens: int,
    pass_k: int = 0,
    temperature: float = 1.0,
    stop: Sequence[str] = (),
    seed: Optional[int] = 0,
    policy: RolloutPolicy | None = None,
    concurrency: int = 8,
) -> Dict[str, float]:
    """``eval/greedy_accuracy``, ``eval/pass@k``, ``eval/reward_mean`` on ``problems``, and the
    greedy trajectories' own metrics averaged as ``eval/greedy/<name>``."""
    import concurrent.futures

    policy = policy or RolloutPolicy()
    stop = list(stop) or None
    greedy_params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
    sampled_params = SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=stop, seed=seed)
    # greedy and pass@k requests for the same prompts run at once, so the sampler prefills each prompt once
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        greedy_f = pool.submit(collect_groups, sampling_client, [task.env_group(p, tokenizer) for p in problems], 1, greedy_params, policy, concurrency=concurrency)
        sampled_f = pool.submit(collect_groups, sampling_client, [task.env_group(p, tokenizer) for p in problems], pass_k, sampled_params,
                                policy, concurrency=concurrency, seeds=None if seed is None else problem_seeds(seed, len(problems))) if pass_k else None
        greedy = greedy_f.result()
        sampled = sampled_f.result() if sampled_f is not None else None
    metrics: Dict[str, float] = {}
    ok = [success(g.trajectories[0], g.rewards[0]) if g.trajectories else False for g in greedy]
    metrics["eval/greedy_accuracy"] = sum(ok) / max(len(ok), 1)
    metrics["eval/greedy_reward_mean"] = sum(g.rewards[0] for g in greedy if g.rewards) / max(len(greedy), 1)
    sums: Dict[str, float] = {}
    for g in greedy:  # the env's own metrics, averaged (e.g. a tool env's tool_calls, used_tool)
        for k, v in (g.trajectories[0].metrics if g.trajectories else {}).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    metrics.update({f"eval/greedy/{k}": v / max(len(greedy), 1) for k, v in sums.items()})
    if sampled is not None:
        hits: List[bool] = []
        per_sample: List[bool] = []
        for g in sampled:
            wins = [success(t, r) for t, r in zip(g.trajectories, g.rewards)]
            hits.append(any(wins))
            per_sample += wins
        metrics[f"eval/pass@{pass_k}"] = sum(hits) / max(len(hits), 1)
        metrics["eval/pass@1_sampled"] = sum(per_sample) / max(len(per_sample), 1)
    metrics["eval/problems"] = float(len(problems))
    return metrics
