"""lm-evaluation-harness on rlkit's engine vs lm-eval's own ``hf`` model: same items, side by side, one run.

    python benchmarks/harness_vs_hf.py                          # GSM8K 5-shot limit 100, MC limit 100
    python benchmarks/harness_vs_hf.py --gen-limit 20 --ll-limit 20   # what a busy 2-core CPU affords

Model: SmolLM2-135M-Instruct (the embedded default; lm-eval's ``hf`` loads rlkit's cached safetensors
copy of it, so both read the same weights), fp32 on both sides (``--precision bf16``: bf16 on both),
offline (rlkit's copy of GSM8K).

- **generate_until**: lm-eval's ``gsm8k`` (5-shot, its own prompt, stop sequences and answer
  extraction; 256 new tokens at most), rlkit's ``rlkit`` model vs ``hf`` at ``--hf-batch-size``
  (lm-eval's default, 1, unless given).
- **loglikelihood**: ``gsm8k_mc``, a multiple-choice task defined here over the same GSM8K items
  (lm-eval has no loglikelihood task over data rlkit ships): the question 5-shot as lm-eval's gsm8k
  prompts it, four candidate worked solutions (the item's own and the next three items'), scored by
  lm-eval's ``acc`` / ``acc_norm`` — the shape of HellaSwag/ARC (a long shared context, a few
  continuations).

Reported: items/s and the ratio, scores, the largest loglikelihood difference over every choice,
whether the greedy generations are identical, this machine's matmul peaks (fp32 / bf16) and its
load average (other processes slow both sides, unevenly). Every number is measured in this run.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def gsm8k_mc_config() -> Dict[str, Any]:
    """The multiple-choice task over rlkit's GSM8K copy (see the module docstring)."""
    from rlkit.harness.tasks import local_data_files

    def add_choices(dataset):
        answers = dataset["answer"]
        n = len(answers)

        def one(doc, i):
            others = [answers[(i + k) % n] for k in (1, 2, 3)]
            gold = i % 4
            return {"choices": others[:gold] + [doc["answer"]] + others[gold:], "gold": gold}

        return dataset.map(one, with_indices=True)

    files = local_data_files("gsm8k")
    return {"task": "gsm8k_mc", "dataset_path": "json", "dataset_kwargs": {"data_files": files},
            "output_type": "multiple_choice", "training_split": "train", "fewshot_split": "train", "test_split": "test",
            "process_docs": add_choices, "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{gold}}", "num_fewshot": 5,
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
            "metadata": {"version": 1.0}}


def build(which: str) -> List[Any]:
    from lm_eval.tasks import TaskManager

    from rlkit.harness import catalog, tasks

    if which == "gsm8k":
        cat = catalog.load_catalog()
        return tasks.build(cat, tasks.select(cat, ["gsm8k"]), online=False)
    return list(TaskManager(include_defaults=False).load([gsm8k_mc_config()])["tasks"].values())


def run(lm: Any, which: str, limit: int) -> Dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    built = build(which)
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=built, limit=limit, bootstrap_iters=0, log_samples=True,
                                  task_manager=TaskManager(include_defaults=False))
    seconds = time.perf_counter() - start
    name = "gsm8k" if which == "gsm8k" else "gsm8k_mc"
    return {"seconds": seconds, "items_per_s": limit / seconds, "samples": out["samples"][name],
            "scores": {k: v for k, v in out["results"][name].items() if "," in k and "stderr" not in k}}


def main() -> None:
    import torch
    from lm_eval.models.huggingface import HFLM

    from rlkit.backends.local.models import _smollm2_cached_dir
    from rlkit.harness.model import RlkitLM
    from session_throughput import matmul_peak

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gen-limit", type=int, default=100)
    p.add_argument("--ll-limit", type=int, default=100)
    p.add_argument("--hf-batch-size", type=int, default=1)
    p.add_argument("--skip", choices=["gen", "ll"], default=None)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="both sides (the 1e-4-nats comparison is fp32's; bf16 measures speed at the same precision)")
    args = p.parse_args()
    import logging

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    hf_dir = _smollm2_cached_dir()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"matmul peak {matmul_peak('float32') / 1e9:.0f} GFLOP/s fp32, {matmul_peak('bfloat16') / 1e9:.0f} bf16; "
          f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    print(f"model: SmolLM2-135M-Instruct ({hf_dir}), {args.precision} both; hf batch_size={args.hf_batch_size}", flush=True)
    rl = RlkitLM(model="smollm2-135m-instruct", precision=args.precision)
    hf = HFLM(pretrained=str(hf_dir), dtype={"fp32": "float32", "bf16": "bfloat16"}[args.precision],
              batch_size=args.hf_batch_size, device="cpu")
    rows = []
    plans = [("gen", "gsm8k", args.gen_limit, "generate_until: gsm8k 5-shot"),
             ("ll", "gsm8k_mc", args.ll_limit, "loglikelihood: gsm8k_mc 5-shot, 4 choices")]
    for key, which, limit, title in plans:
        if args.skip == key:
            continue
        ours = run(rl, which, limit)
        print(f"{title}: rlkit {ours['seconds']:.1f} s", flush=True)
        theirs = run(hf, which, limit)
        print(f"{title}: hf {theirs['seconds']:.1f} s", flush=True)
        if key == "gen":
            pairs = {(a["doc_id"], b["doc_id"]): a["resps"] == b["resps"] for a, b in zip(ours["samples"], theirs["samples"])}
            detail = f"identical generations {sum(pairs.values())}/{len(pairs)}"  # (a sample per filter: counted once)
        else:
            diffs = [abs(x[0][0] - y[0][0]) for a, b in zip(ours["samples"], theirs["samples"]) for x, y in zip(a["resps"], b["resps"])]
            detail = f"max |loglik diff| {max(diffs):.2e} nats over {len(diffs)} choices"
        rows.append((title, limit, ours, theirs, detail))
    print(f"\nload average at end {os.getloadavg()[0]:.2f}\n")
    print("| task | items | rlkit items/s | hf items/s | ratio | rlkit scores | hf scores | check |")
    print("|---|---|---|---|---|---|---|---|")
    for title, limit, ours, theirs, detail in rows:
        fmt = lambda s: ", ".join(f"{k.split(',')[0]}/{k.split(',')[1]} {v:.3f}" for k, v in s.items())  # noqa: E731
        print(f"| {title} | {limit} | {ours['items_per_s']:.3f} | {theirs['items_per_s']:.3f} | "
              f"{ours['items_per_s'] / theirs['items_per_s']:.2f}x | {fmt(ours['scores'])} | {fmt(theirs['scores'])} | {detail} |")
    rl.close()


if __name__ == "__main__":
    main()
