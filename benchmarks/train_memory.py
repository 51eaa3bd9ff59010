"""Peak memory and time of one ``forward_backward`` per ``micro_batch_tokens`` value and precision.

    python benchmarks/train_memory.py [--budgets 1024 2048] [--precisions fp32 bf16] [--shape rl|plain]
                                      [--prompt 200] [--completion 100]

``rl`` (default): 64 datums, 8 groups of 8 completions sharing a ``--prompt``-token prompt (200),
completions of half to all of ``--completion`` tokens (100), importance-sampling loss on the
completions; a group whose prompt + 8 completions exceed the budget is split by rows, and each
part runs the prompt again. ``plain``: 16 distinct 256-token
sequences (``session_throughput.py``'s training shape). Each (budget, precision) runs in a fresh
process (peak RSS is per process): model load, two ``forward_backward`` calls; prints the peak
RSS and the second call's seconds. Random token ids (memory and time do not depend on them).
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


def one(budget: int, precision: str, args) -> None:
    import rlkit

    svc = rlkit.connect("local", precision=precision, device="cpu", micro_batch_tokens=budget)
    trainer = svc.create_lora_training_client("smollm2-135m-instruct", rank=16, alpha=32)
    data = batch(args.shape, args.prompt, args.completion)
    trainer.forward_backward(data, "importance_sampling").result()
    t0 = time.perf_counter()
    trainer.forward_backward(data, "importance_sampling").result()
    seconds = time.perf_counter() - t0
    svc.close()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--shape", default="rl", choices=["rl", "plain"])
    parser.add_argument("--prompt", type=int, default=200, help="rl shape: tokens of each group's shared prompt")
    parser.add_argument("--completion", type=int, default=100, help="rl shape: most tokens of a completion")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(int(args.one[0]), args.one[1], args)
        return
    import torch

    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads; shape {args.shape}"
          + (f", 8 groups x 8, prompt {args.prompt}, completions <= {args.completion} tokens" if args.shape == "rl" else ", 16 x 256") + "\n")
    print("| micro_batch_tokens | " + " | ".join(f"{p} peak RSS, GB | {p} seconds" for p in args.precisions) + " |")
    print("|---" * (1 + 2 * len(args.precisions)) + "|")
    for budget in args.budgets:
        cells = []
        for precision in args.precisions:
            cmd = [sys.executable, os.path.abspath(__file__), "--shape", args.shape, "--prompt", str(args.prompt),
                   "--completion", str(args.completion), "--one", str(budget), precision]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            peak, seconds = map(float, out.stdout.strip().splitlines()[-1].split())
            cells += [f"{peak:.2f}", f"{seconds:.1f}"]
        print(f"| {budget} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
