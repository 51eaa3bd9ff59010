"""Local vs vLLM sampling on the same machine, same model, same LoRA adapter.

    bash scripts/install.sh vllm
    .venv/bin/python benchmarks/vllm_sampling.py [--model smollm2-135m-instruct] [--tokens 64] [--url http://host:8000]

Arms (each after a warm-up): batch-1 greedy decode (tok/s), and GRPO-shaped groups — P prompts ×
G samples × T new tokens, every group submitted at once (tok/s of sampled tokens). Both samplers
hold the same trained (non-zero) adapter: rlkit's in-process sampler, then vLLM's server
(started here after the local arms, so the two never share the cores; ``--url`` uses yours).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

import rlkit
from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams


def _datum(tokens):
    return Datum(model_input=ModelInput.from_ints(tokens),
                 loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": [1.0] * (len(tokens) - 1) + [0.0]})


def _trained(service, model):
    trainer = service.create_lora_training_client(model, rank=16)
    tok = trainer.get_tokenizer()
    for _ in range(2):
        trainer.forward_backward([_datum(tok.encode("What is 17 + 25? 17 + 25 = 42.", add_special_tokens=False))]).result()
        trainer.optim_step(AdamParams(learning_rate=1e-3)).result()
    return trainer, trainer.save_weights_and_get_sampling_client()


def _prompts(tok, n):
    return [tok.encode(f"Question {i}: what is {10 + i} + {20 + 3 * i}? Explain step by step.", add_special_tokens=False) for i in range(n)]


def measure(sampler, tok, tokens, prompts, group):
    greedy = SamplingParams(max_tokens=tokens, temperature=0.0)
    sampler.sample(_prompts(tok, 1)[0], sampling_params=SamplingParams(max_tokens=4)).result()  # warm-up
    t0, n = time.perf_counter(), 0
    for p in _prompts(tok, 3):
        n += len(sampler.sample(p, sampling_params=greedy, stop_token_ids=[]).result().sequences[0].tokens)
    batch1 = n / (time.perf_counter() - t0)
    hot = SamplingParams(max_tokens=tokens, temperature=1.0)
    t0 = time.perf_counter()
    futures = [sampler.sample(p, num_samples=group, sampling_params=hot, stop_token_ids=[]) for p in _prompts(tok, prompts)]
    n = sum(len(s.tokens) for f in futures for s in f.result().sequences)
    groups = n / (time.perf_counter() - t0)
    return batch1, groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--url", action="append", default=[])
    ap.add_argument("--dir", default="runs/vllm_sampling")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; model {args.model}; {args.prompts}x{args.group}x{args.tokens} groups")
    rows = []
    with rlkit.connect("local", precision=args.precision, checkpoint_dir=f"{args.dir}/local") as service:
        print(f"local precision: {service.precision} ({service.precision_reason})")
        trainer, sampler = _trained(service, args.model)
        rows.append(("rlkit local", *measure(sampler, trainer.get_tokenizer(), args.tokens, args.prompts, args.group)))
        del sampler
    vllm = {"urls": args.url} if args.url else {"launch": True, "log_dir": args.dir}
    with rlkit.connect("local", sampler="vllm", vllm=vllm, precision=args.precision, checkpoint_dir=f"{args.dir}/vllm") as service:
        trainer, sampler = _trained(service, args.model)
        rows.append(("vLLM (" + ("your servers" if args.url else "launched here, --dtype auto") + ")",
                     *measure(sampler, trainer.get_tokenizer(), args.tokens, args.prompts, args.group)))
        del sampler
    print(f"\n| sampler | batch-1 greedy tok/s | groups {args.prompts}x{args.group}x{args.tokens} tok/s |\n|---|---|---|")
    for name, b1, g in rows:
        print(f"| {name} | {b1:.1f} | {g:.1f} |")
    (_, lb, lg), (_, vb, vg) = rows
    print(f"| ratio local/vLLM | {lb / vb:.2f}x | {lg / vg:.2f}x |")


if __name__ == "__main__":
    main()
