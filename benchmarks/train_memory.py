"""Peak memory and time of one ``forward_backward`` per ``micro_batch_tokens`` value and precision.

    python benchmarks/train_memory.py [--budgets 1024 2048] [--precisions fp32 bf16] [--shape rl|plain]
                                      [--prompt 200] [--completion 100]

``--allocators system mimalloc`` runs every arm (HF + PEFT too) once per ``malloc``: glibc's, or the
library preloaded into the arm's process as the ``rlkit`` command does, with its settings (``rlkit/malloc_preload.py``;
``jemalloc``/``tcmalloc`` where installed). ``--checkpointing false true auto`` runs rlkit once per ``backend.activation_checkpointing``
value (``--return-freed-memory``: each also with ``RLKIT_RETURN_FREED_MEMORY=1``, glibc's mmap
threshold fixed: ``rlkit/backends/local/allocator.py``); ``--hf`` adds plain HF + PEFT doing the same maths in the same token budget (rows packed
up to the budget, full logits + log-softmax), the baseline the ratios are against.

``rl`` (default): 64 datums, 8 groups of 8 completions sharing a ``--prompt``-token prompt (200),
completions of half to all of ``--completion`` tokens (100), importance-sampling loss on the
completions; a group whose prompt + 8 completions exceed the budget runs in parts of rows with its
prompt once (``rlkit/backends/local/prompt_split.py``). ``plain``: 16 distinct 256-token
sequences (``session_throughput.py``'s training shape). Each arm runs in a fresh process (peak RSS
is per process): model load, a warm-up ``forward_backward`` of one group, then the whole batch;
prints the peak RSS and the whole batch's seconds. Random token ids (memory and time do not depend on them).
``--repeats N`` runs every rlkit arm N times, one round of all arms after another (this machine's
speed drifts by +-25 % from minute to minute), and ends with each arm's median.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def batch(shape: str, prompt_tokens: int = 200, completion_tokens: int = 100):
    import torch

    from rlkit.types import Datum, ModelInput, TensorData

    rng = random.Random(0)
    groups, rows, prompt_len = (8, 8, prompt_tokens) if shape == "rl" else (16, 1, 0)
    data = []
    for _ in range(groups):
        prompt = [rng.randrange(100, 40000) for _ in range(prompt_len)]
        for i in range(rows):
            n = rng.randrange(completion_tokens // 2, completion_tokens + 1) if prompt_len else 257
            tokens = prompt + [rng.randrange(100, 40000) for _ in range(n)]
            weights = torch.tensor([0.0] * max(prompt_len - 1, 0) + [1.0] * (n if prompt_len else n - 1))
            data.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
                "target_tokens": TensorData.from_torch(torch.tensor(tokens[1:])),
                "logprobs": TensorData.from_torch(torch.zeros(len(tokens) - 1)),
                "weights": TensorData.from_torch(weights),
                "advantages": TensorData.from_torch(weights * (1.0 if i % 2 else -1.0)),
            }))
    return data


def one(budget: int, precision: str, checkpointing: str, args) -> None:
    import rlkit

    svc = rlkit.connect("local", precision=precision, device="cpu", micro_batch_tokens=budget, activation_checkpointing=checkpointing)
    trainer = svc.create_lora_training_client("smollm2-135m-instruct", rank=16, alpha=32)
    data = batch(args.shape, args.prompt, args.completion)
    trainer.forward_backward(data[:8], args.loss).result()  # warm-up: one group
    t0 = time.perf_counter()
    trainer.forward_backward(data, args.loss).result()
    seconds = time.perf_counter() - t0
    layers = trainer._engine.checkpointed_layers
    svc.close()
    from rlkit.malloc_preload import active

    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, seconds, f"{min(layers)}-{max(layers)}/{trainer._engine.n_layers}", active())


def hf_one(budget: int, precision: str, args) -> None:
    """Plain transformers + peft doing the same maths: right-padded rows, as many per micro-batch
    as fit ``budget`` padded tokens, full logits -> log_softmax -> target logprobs, the same loss."""
    import torch
    from peft import LoraConfig, get_peft_model

    from rlkit.backends.local.models import load_model

    lm = load_model("smollm2-135m-instruct")
    model = get_peft_model(lm.model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    model.train()
    data = batch(args.shape, args.prompt, args.completion)

    def forward_backward(rows):
        start = 0
        while start < len(rows):
            end = start + 1
            while end < len(rows) and (end + 1 - start) * max(r.model_input.length for r in rows[start:end + 1]) <= budget:
                end += 1
            part = rows[start:end]
            width = max(r.model_input.length for r in part)
            ids = torch.zeros((len(part), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            inputs = {k: torch.zeros((len(part), width)) for k in ("target_tokens", "weights", "logprobs", "advantages")}
            for i, r in enumerate(part):
                n = r.model_input.length
                ids[i, :n], mask[i, :n] = torch.tensor(r.model_input.to_ints()), 1
                for k in inputs:
                    inputs[k][i, :n] = r.loss_fn_inputs[k].to_torch().float()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = model(input_ids=ids, attention_mask=mask).logits
            logprobs = torch.log_softmax(logits.float(), -1).gather(-1, inputs["target_tokens"].long().unsqueeze(-1)).squeeze(-1)
            ratio, adv, w = torch.exp(logprobs - inputs["logprobs"]), inputs["advantages"], inputs["weights"]
            objective = ratio * adv if args.loss == "importance_sampling" else torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            (-(w * objective).sum()).backward()
            start = end

    forward_backward(data[:8])
    t0 = time.perf_counter()
    forward_backward(data)
    seconds = time.perf_counter() - t0
    from rlkit.malloc_preload import active

    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, seconds, "-", active())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--checkpointing", nargs="+", default=["false"], choices=["false", "true", "auto"],
                        help="backend.activation_checkpointing values (one rlkit run each)")
    parser.add_argument("--allocators", nargs="+", default=["system"],
                        help="malloc of every arm: system, mimalloc (what the rlkit command preloads), jemalloc, tcmalloc")
    parser.add_argument("--hf", action="store_true", help="also run plain HF + PEFT at each budget")
    parser.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "ppo"])
    parser.add_argument("--shape", default="rl", choices=["rl", "plain"])
    parser.add_argument("--prompt", type=int, default=200, help="rl shape: tokens of each group's shared prompt")
    parser.add_argument("--completion", type=int, default=100, help="rl shape: most tokens of a completion")
    parser.add_argument("--return-freed-memory", action="store_true",
                        help="also run each rlkit arm with RLKIT_RETURN_FREED_MEMORY=1 (glibc's mmap threshold fixed, rlkit.backends.local.allocator)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every rlkit arm this many times, round by round (HF + PEFT once), and print each arm's median;"
                             " times in the summary are against the first rlkit arm (e.g. --checkpointing false auto"
                             " --allocators system mimalloc: the old default, glibc without checkpointing)")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        if args.one[2] == "hf":
            hf_one(int(args.one[0]), args.one[1], args)
        else:
            one(int(args.one[0]), args.one[1], args.one[2], args)
        return
    import psutil
    import torch

    from rlkit.malloc_preload import MIMALLOC_SETTINGS, library
    from session_throughput import matmul_peak

    libraries = {name: library(name) for name in args.allocators}  # a missing one fails here, before any arm
    print(f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / 1024**3:.0f} GiB, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; matmul peak {matmul_peak('float32') / 1e9:.0f} GFLOP/s fp32, {matmul_peak('bfloat16') / 1e9:.0f} bf16; "
          f"shape {args.shape}, loss {args.loss}"
          + (f", 8 groups x 8, prompt {args.prompt}, completions {args.completion // 2}-{args.completion} tokens" if args.shape == "rl" else ", 16 x 256") + "\n")
    print("| arm | malloc | micro_batch_tokens | activation_checkpointing | precision | peak RSS, GiB | seconds | layers checkpointed | peak vs HF | time vs HF |")
    print("|---" * 10 + "|")
    for budget in args.budgets:
        for precision in args.precisions:
            base = None
            arms = [("hf", False, a) for a in args.allocators] if args.hf else []
            for arm in args.checkpointing:
                for allocator in args.allocators:
                    arms += [(arm, False, allocator)] + ([(arm, True, allocator)] if args.return_freed_memory else [])
            runs = {}  # (name, allocator, arm) -> [(peak, seconds, layers)]
            order = [(arm, tuned, allocator, r) for r in range(max(args.repeats, 1)) for arm, tuned, allocator in arms
                     if r == 0 or arm != "hf"]  # round by round, so a slow minute of the machine hits every arm
            for arm, tuned, allocator, _ in order:
                cmd = [sys.executable, os.path.abspath(__file__), "--shape", args.shape, "--prompt", str(args.prompt),
                       "--completion", str(args.completion), "--loss", args.loss, "--one", str(budget), precision, arm]
                env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
                env.update({"RLKIT_RETURN_FREED_MEMORY": "1"} if tuned else {})
                if libraries[allocator]:  # preloaded as the rlkit command does it, with its settings
                    env["LD_PRELOAD"] = libraries[allocator]
                    env.update(MIMALLOC_SETTINGS if "mimalloc" in libraries[allocator] else {})
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if out.returncode:
                    raise SystemExit(out.stderr[-3000:])
                peak, seconds, layers, loaded = out.stdout.strip().splitlines()[-1].split()
                peak, seconds = float(peak), float(seconds)
                if arm == "hf" and base is None:  # the baseline: HF + PEFT on the first allocator listed
                    base = (peak, seconds)
                ratios = f"{peak / base[0]:.2f}x | {seconds / base[1]:.2f}x" if base else " | "
                name = "HF + PEFT" if arm == "hf" else "rlkit, RLKIT_RETURN_FREED_MEMORY=1" if tuned else "rlkit"
                runs.setdefault((name, loaded, '' if arm == 'hf' else arm), []).append((peak, seconds, layers))
                print(f"| {name} | {loaded} | {budget} | {'' if arm == 'hf' else arm} | {precision} | {peak:.2f} | {seconds:.1f} | {layers} | {ratios} |", flush=True)
            if args.repeats > 1:
                print_medians(runs, base)


def print_medians(runs, base) -> None:
    """Each arm's median peak and seconds over its runs; times against the first rlkit arm."""
    from statistics import median

    reference = next(median(s for _, s, _ in v) for k, v in runs.items() if k[0] != "HF + PEFT")
    print("\n| arm | malloc | activation_checkpointing | runs | median peak RSS, GiB | median seconds | seconds of each run | peak vs HF | time vs the first rlkit arm |")
    print("|---" * 9 + "|")
    for (name, loaded, arm), values in runs.items():
        peak, seconds = median(p for p, _, _ in values), median(s for _, s, _ in values)
        each = ", ".join(f"{s:.1f}" for _, s, _ in values)
        vs_hf = f"{peak / base[0]:.2f}x" if base else ""
        print(f"| {name} | {loaded} | {arm} | {len(values)} | {peak:.2f} | {seconds:.1f} | {each} | {vs_hf} | {seconds / reference:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
