"""What Tinker's wire protocol costs per RL step: the same GRPO step in-process (rlkit's local
backend), through the real ``tinker`` SDK to ``rlkit serve tinker`` (a separate process on this
machine, same engine), and through rlkit's ``tinker`` backend on top of that SDK.

    python benchmarks/tinker_rl_step.py                                  # tiny model, ~1 min
    python benchmarks/tinker_rl_step.py --model smollm2-135m-instruct --reps 5

One step: sampler weights from the trainer, ``--prompts`` prompts x ``--group`` samples of
``--max-tokens`` new tokens (temperature 1, fixed seeds), GRPO advantages (reward: completion
length parity), one ``importance_sampling`` ``forward_backward`` over every sample, one
``optim_step``. Steps run ``--reps`` times after one warm-up, interleaving the three paths so a busy
machine slows them alike; the table shows median seconds per step, each phase's median, and the
ratio to the in-process step. The server's engine and the local backend use the same number of
torch threads (1 by default). Every number is measured in this run; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TINKER_TELEMETRY", "0")

PROMPTS = ["What is 17 + 25?", "Name a prime number.", "Say something about the number 7.", "Count to three."]


def start_server(threads: int, model_dir: str, extra=()):
    """``rlkit serve tinker`` on a free port (``extra``: more server flags); the process and its URL."""
    cmd = [sys.executable, "-m", "rlkit", "serve", "tinker", "--port", "0", "--num-threads", str(threads), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("the Tinker server did not start")


def advantages(samples):
    rewards = [float(len(s) % 2 == 0) for s in samples]
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def rlkit_step(trainer, prompts, args):
    """One step through rlkit's session API (local backend or backend=tinker)."""
    from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams

    t = {}
    t0 = time.perf_counter()
    sampler = trainer.save_weights_and_get_sampling_client()
    futures = [
        sampler.sample(p, args.group, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    results = [f.result() for f in futures]
    t["sample"] = time.perf_counter() - t0
    data = []
    for prompt, res in zip(prompts, results):
        for seq, adv in zip(res.sequences, advantages([s.tokens for s in res.sequences])):
            toks = prompt + seq.tokens
            n, k = len(toks), len(prompt)
            data.append(
                Datum(
                    model_input=ModelInput.from_ints(toks),
                    loss_fn_inputs={
                        "target_tokens": toks[1:] + [0],
                        "weights": [0.0] * (k - 1) + [1.0] * (n - k) + [0.0],
                        "logprobs": [0.0] * (k - 1) + list(seq.logprobs) + [0.0],
                        "advantages": [adv] * n,
                    },
                )
            )
    t1 = time.perf_counter()
    fb = trainer.forward_backward(data, "importance_sampling")
    opt = trainer.optim_step(AdamParams(learning_rate=1e-4))
    fb.result(), opt.result()
    t["train"] = time.perf_counter() - t1
    t["step"] = time.perf_counter() - t0
    return t


def sdk_step(trainer, prompts, args, seed: int = 0, between=None):
    """The same step written against the tinker SDK (as tinker-cookbook's rl_loop does). Prompt
    ``i`` samples with seed ``seed + i``; ``between()``, if given, runs after sampling (many_runs:
    a barrier). Besides the times: the ``sampled`` tokens, their count ``sampled_tokens``,
    ``train_tokens`` and forward_backward's ``metrics``."""
    from tinker import types

    t = {}
    t0 = time.perf_counter()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    t["save"] = time.perf_counter() - t0
    futures = [
        sampler.sample(
            types.ModelInput.from_ints(p),
            args.group,
            types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=seed + i),
        )
        for i, p in enumerate(prompts)
    ]
    results = [f.result() for f in futures]
    t["sample"] = time.perf_counter() - t0
    t["sampled"] = [list(s.tokens) for r in results for s in r.sequences]
    t["sampled_tokens"] = sum(map(len, t["sampled"]))
    if between is not None:
        between()
    data = []
    for prompt, res in zip(prompts, results):
        for seq, adv in zip(res.sequences, advantages([s.tokens for s in res.sequences])):
            ob = len(prompt) - 1
            model_input = types.ModelInput.from_ints(prompt + list(seq.tokens[:-1]))
            data.append(
                types.Datum(
                    model_input=model_input,
                    loss_fn_inputs={
                        "target_tokens": [0] * ob + list(seq.tokens),
                        "logprobs": [0.0] * ob + list(seq.logprobs),
                        "advantages": [0.0] * ob + [adv] * (model_input.length - ob),
                    },
                )
            )
    t1 = time.perf_counter()
    fb = trainer.forward_backward(data, "importance_sampling")
    opt = trainer.optim_step(types.AdamParams(learning_rate=1e-4))
    t["metrics"] = dict(fb.result().metrics)
    t["forward_backward"] = time.perf_counter() - t1
    opt.result()
    t["train"] = time.perf_counter() - t1
    t["optim_step"] = t["train"] - t["forward_backward"]
    t["step"] = time.perf_counter() - t0
    t["train_tokens"] = sum(d.model_input.length for d in data)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import tinker

    import rlkit

    proc, url = start_server(args.threads, args.model)
    try:
        local = rlkit.connect("local", num_threads=args.threads)
        remote = rlkit.connect("tinker", base_url=url, api_key="tml-bench")
        sdk = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        tok = local.get_tokenizer(args.model)
        from rlkit.chat import prompt_tokens

        prompts = [
            list(prompt_tokens(tok, [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]))
            for i in range(args.prompts)
        ]
        paths = {
            "in-process (local backend)": (
                rlkit_step,
                local.create_lora_training_client(args.model, rank=16, alpha=32, seed=0),
            ),
            "tinker SDK -> rlkit serve tinker": (
                sdk_step,
                sdk.create_lora_training_client(base_model=args.model, rank=16, seed=0).result(),
            ),
            "backend=tinker -> rlkit serve tinker": (
                rlkit_step,
                remote.create_lora_training_client(args.model, rank=16, alpha=32, seed=0),
            ),
        }
        times = {name: [] for name in paths}
        for rep in range(args.reps + 1):
            for name, (fn, trainer) in paths.items():
                t = fn(trainer, prompts, args)
                if rep:
                    times[name].append(t)
        remote.close()
        sdk.close("success").result()
        local.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    base = statistics.median(t["step"] for t in times["in-process (local backend)"])
    rows = {}
    for name, ts in times.items():
        med = {k: statistics.median(t[k] for t in ts) for k in ("step", "sample", "train")}
        rows[name] = {**med, "ratio": med["step"] / base}
    import platform

    machine = (f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
               f"{args.threads} thread(s), model {args.model}")
    if args.json:
        print(json.dumps({"machine": machine, "args": vars(args), "rows": rows}, indent=2))
        return
    print(
        f"machine: {machine}; {args.prompts} prompts x {args.group} samples x {args.max_tokens} tokens; "
        f"median of {args.reps}"
    )
    print(f"{'path':<40} {'step s':>8} {'sample s':>9} {'train s':>8} {'x local':>8}")
    for name, r in rows.items():
        print(f"{name:<40} {r['step']:>8.3f} {r['sample']:>9.3f} {r['train']:>8.3f} {r['ratio']:>8.2f}")


if __name__ == "__main__":
    main()
