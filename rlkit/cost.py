"""``rlkit cost recipe=NAME [key=value ...] [run=DIR] [prices]``: how many tokens a run processes,
and what that costs per token versus per GPU-hour. The numbers are estimates and say so.

Before a run (from the dataset and config, RL recipes): with B problems per step, G samples per
problem, M = ``max_tokens``, T turns, and L = the mean prompt length of the training problems
(tokenized with the model's own chat template):

- prefill  = steps * B * L                 (a group's prompt is prefilled once)
- sampled  <= steps * B * G * M * T        (an upper bound: completions may stop early)
- trained  <= steps * B * G * (L + M * T)  (every token of every trajectory, prompt included, as a
  per-token service counts them; dropped zero-variance groups make it smaller)
- evaluation: problems * (1 + pass_k) samples at each evaluation (reported separately).

After a run (``run=DIR``): the counts logged in ``metrics.jsonl``, and the tokens an LLM-as-judge
reward spent (``tokens/judge_prompt`` + ``tokens/judge_completion``; priced with ``judge_price``).

Prices: ``prefill_price``, ``sampled_price``, ``train_price`` in currency per 1M tokens;
``gpu_hour_price`` with ``train_tok_s`` / ``sample_tok_s`` (throughput of one GPU, e.g. from
``benchmarks/``) converts the same work into GPU-hours for comparison.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from rlkit.errors import ConfigError

PRICE_KEYS = ("prefill_price", "sampled_price", "train_price", "gpu_hour_price", "train_tok_s", "sample_tok_s", "judge_price")


def estimate(cfg: Any, tokenizer: Any = None) -> Dict[str, float]:
    """Token estimate of an RL recipe's training steps and evaluations (see module docstring);
    prompts are measured with ``tokenizer`` (a run's own trainer's), else the local engine's for
    ``cfg.model.base_model``."""
    from omegaconf import OmegaConf

    from rlkit.backends.local.models import load_tokenizer
    from rlkit.tasks import build_task

    if cfg.loop not in ("rl", "task_sft"):
        raise ConfigError(f"cost estimates RL recipes (loop rl / task_sft); {cfg.recipe!r} runs {cfg.loop!r}")
    t = cfg.train
    task = build_task(OmegaConf.to_container(t.task, resolve=True))
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model.base_model)
    problems = task.problems("train")
    lengths = [len(task.env_group(p, tokenizer).prompt) for p in problems]
    mean_prompt = sum(lengths) / len(lengths)
    steps, b, g, m, turns = int(t.steps), int(t.groups_per_batch), int(t.group_size), int(t.max_tokens), int(t.rollout.max_turns)
    test = task.problems("test")[: int(t.eval.problems)] if t.eval.problems else []
    test_prompt = sum(len(task.env_group(p, tokenizer).prompt) for p in test) / max(len(test), 1)
    evals = (1 + (len([s for s in range(1, steps) if t.eval_every and s % t.eval_every == 0])) + 1) if test else 0
    eval_m = int(t.eval.max_tokens or m)
    if cfg.loop == "task_sft":
        return {"prefill": 0.0, "sampled": 0.0, "trained": steps * b * (mean_prompt + m), "mean_prompt_tokens": mean_prompt,
                "eval_prefill": evals * len(test) * 2 * test_prompt, "eval_sampled": evals * len(test) * (1 + int(t.eval.pass_k)) * eval_m}
    return {
        "prefill": steps * b * mean_prompt * turns,
        "sampled": steps * b * g * m * turns,
        "trained": steps * b * g * (mean_prompt + m * turns),
        "mean_prompt_tokens": mean_prompt,
        "eval_prefill": evals * len(test) * 2 * test_prompt,
        "eval_sampled": evals * len(test) * (1 + int(t.eval.pass_k)) * eval_m,
    }


def preview(cfg: Any, prices: Optional[Dict[str, Optional[float]]] = None, tokenizer: Any = None) -> Optional[Dict[str, float]]:
    """What a recipe with ``cost_preview: true`` prints before it starts training: the token
    estimate of ``rlkit cost recipe=...`` for this config, prompts measured with ``tokenizer`` (the
    run's trainer's, on any engine) or else the local engine's (the embedded model's, and said so,
    where the run's own is not on this machine). Never fails the run."""
    from omegaconf import OmegaConf

    from rlkit.backends.local.models import DEFAULT_MODEL

    note = ""
    try:
        try:
            est = estimate(cfg, tokenizer)
        except Exception as exc:  # noqa: BLE001 - the model's tokenizer is not here (no network): measure with ours
            if cfg.model.base_model == DEFAULT_MODEL:
                raise
            other = OmegaConf.merge(cfg, {"model": {"base_model": DEFAULT_MODEL}})
            est = estimate(other)
            note = f" (prompt lengths measured with {DEFAULT_MODEL}'s tokenizer: {cfg.model.base_model}'s is not on this machine: {type(exc).__name__})"
    except Exception as exc:  # noqa: BLE001 - an estimate is a courtesy, not a precondition
        print(f"rlkit cost: no estimate for {cfg.get('recipe')} ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})", flush=True)
        return None
    print(f"rlkit cost (estimate, before the run){note}:", flush=True)
    report([("estimate (upper bounds for sampled/trained)", est)], prices or {k: None for k in PRICE_KEYS}, est)
    print(f"the same tokens on every backend; price them with `rlkit cost recipe={cfg.get('recipe')} prefill_price=.. sampled_price=.. "
          "train_price=..` (a managed service's per-token prices) or gpu_hour_price=.. train_tok_s=.. sample_tok_s=.. (your GPUs)", flush=True)
    return est


def actual(run_dir: Path) -> Dict[str, float]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"run={run_dir}: no metrics.jsonl there")
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {
        "prefill": sum(m.get("tokens/prefill", 0.0) for m in lines),
        "sampled": sum(m.get("tokens/sampled", 0.0) for m in lines),
        "trained": sum(m.get("tokens/trained", 0.0) for m in lines),
        # an LLM-as-judge reward's requests (rlkit.rewards.judge), prompt + completion
        "judge": sum(m.get("tokens/judge_prompt", 0.0) + m.get("tokens/judge_completion", 0.0) for m in lines),
    }


def money(tokens: Dict[str, float], prices: Dict[str, Optional[float]]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {}
    per_token = [(tokens.get(k, 0.0), prices.get(f"{k}_price")) for k in ("prefill", "sampled")] + [(tokens.get("trained", 0.0), prices.get("train_price"))]
    if all(p is not None for _, p in per_token):
        out["per_token_cost"] = sum(n * p / 1e6 for n, p in per_token)
    if prices.get("gpu_hour_price") and prices.get("train_tok_s") and prices.get("sample_tok_s"):
        hours = (tokens.get("trained", 0.0) / prices["train_tok_s"] + tokens.get("sampled", 0.0) / prices["sample_tok_s"]) / 3600
        out["gpu_hours"] = hours
        out["gpu_cost"] = hours * prices["gpu_hour_price"]
    return out


def report(rows: List[Any], prices: Dict[str, Optional[float]], est: Dict[str, float], *, with_judge: bool = False) -> None:
    """The cost table of ``rows`` (label, token counts) at ``prices``, then the evaluation's tokens."""
    print("Estimates, not invoices: token counts follow the formulas in `rlkit cost --help`; prices are the ones you give.\n")
    print("| | prefill tokens | sampled tokens | trained tokens | per-token cost | GPU-hours | GPU cost |")
    print("|---|---|---|---|---|---|---|")
    for label, tokens in rows:
        m = money(tokens, prices)
        cells = [f"{tokens.get(k, 0.0):,.0f}" for k in ("prefill", "sampled", "trained")]
        cells += [f"{m['per_token_cost']:.4f}" if "per_token_cost" in m else "—", f"{m['gpu_hours']:.4f}" if "gpu_hours" in m else "—",
                  f"{m['gpu_cost']:.4f}" if "gpu_cost" in m else "—"]
        print(f"| {label} | " + " | ".join(cells) + " |")
    judged = rows[-1][1].get("judge", 0.0) if with_judge else 0.0
    if judged:
        cost = f", {judged * prices['judge_price'] / 1e6:.4f} at judge_price" if prices.get("judge_price") is not None else ""
        print(f"\nLLM-as-judge reward (not in the above): {judged:,.0f} tokens (prompt + completion){cost}")
    print(f"\nevaluation (not in the above): ~{est['eval_prefill']:,.0f} prefill and <= {est['eval_sampled']:,.0f} sampled tokens; "
          f"mean prompt {est['mean_prompt_tokens']:.1f} tokens")
