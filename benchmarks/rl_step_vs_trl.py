"""The same GRPO step in rlkit and in TRL's GRPOTrainer, side by side, in one run.

    pip install 'trl==1.16.0'   # benchmark-only dependency (bash scripts/install.sh bench)
    python benchmarks/rl_step_vs_trl.py [--steps 3] [--precision auto|fp32|bf16]

Same model (SmolLM2-135M-Instruct, the embedded default), same 8 prompts (2-digit addition,
3-shot chat turns + "a + b =" prefill), 8 completions each, at most 32 new tokens, temperature 1,
LoRA r16/alpha32 on attention+MLP, AdamW lr 1e-5, GRPO advantages (group mean/std), token-mean
PPO-clip loss (TRL's default ``loss_type="dapo"``, beta=0), one optimizer step per batch. TRL keeps
its defaults otherwise (gradient checkpointing on). The steps alternate: every TRL step is followed
by one rlkit step, timed from TRL's own step callbacks. Peak memory is measured per framework in
a fresh subprocess. Prints wall time per step, tokens/s and peak RSS, with ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

GROUPS, G, MAX_NEW, LR = 8, 8, 32, 1e-5


def problems():
    from rlkit.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    return task, task.problems("train")[:GROUPS]


class RlkitStep:
    """One synchronous GRPO step on the local backend (sample -> reward -> PPO -> optim -> publish)."""

    def __init__(self, precision: str):
        import rlkit

        self.rlkit = rlkit
        self.svc = rlkit.connect("local", precision=precision)
        self.trainer = self.svc.create_lora_training_client("smollm2-135m-instruct", rank=16, alpha=32, seed=0)
        self.tok = self.trainer.get_tokenizer()
        self.task, self.problems = problems()
        self.sampler = self.trainer.save_weights_and_get_sampling_client()
        self.sampled_tokens = 0

    def __call__(self, step: int) -> float:
        from rlkit.losses import PPO, run_loss
        from rlkit.rl.advantages import compute_advantages
        from rlkit.rl.collect import RolloutPolicy, collect_groups
        from rlkit.rl.datums import trajectory_datum

        t0 = time.perf_counter()
        params = self.rlkit.SamplingParams(max_tokens=MAX_NEW, temperature=1.0)
        groups = collect_groups(self.sampler, [self.task.env_group(p, self.tok) for p in self.problems], G, params, RolloutPolicy(),
                                seeds=[step * 100 + i for i in range(GROUPS)])
        data = []
        for g in groups:
            data += [trajectory_datum(t, a, 1.0) for t, a in zip(g.trajectories, compute_advantages(g.rewards))]
            self.sampled_tokens += g.decode_tokens
        run_loss(self.trainer, data, PPO(), aggregation="token_mean")
        self.trainer.optim_step(self.rlkit.AdamParams(learning_rate=LR, weight_decay=0.0)).result()
        self.sampler = self.trainer.save_weights_and_get_sampling_client()
        return time.perf_counter() - t0


def trl_trainer(precision: str, callbacks=()):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlkit.backends.local.models import _smollm2_cached_dir
    from rlkit.tasks.arithmetic import first_integer

    path = str(_smollm2_cached_dir())
    tok = AutoTokenizer.from_pretrained(path)
    task, probs = problems()
    prompts = [tok.decode(task.prompt(p, tok)) for p in probs]
    answers = [int(p["answer"]) for p in probs]
    dataset = Dataset.from_dict({"prompt": prompts * 50, "answer": answers * 50})

    def reward(completions, answer, **_):
        return [1.0 if first_integer(c) == a else 0.0 for c, a in zip(completions, answer)]

    config = GRPOConfig(
        output_dir="/tmp/rlkit-trl-bench", use_cpu=True, bf16=precision == "bf16", learning_rate=LR, weight_decay=0.0,
        per_device_train_batch_size=GROUPS * G, num_generations=G, max_completion_length=MAX_NEW, temperature=1.0,
        max_steps=10_000, logging_steps=1, save_strategy="no", report_to=[], seed=0, shuffle_dataset=False,
    )
    model = AutoModelForCausalLM.from_pretrained(path)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], lora_dropout=0.0)
    return GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tok, peft_config=lora, callbacks=list(callbacks))


def alternate(steps: int, precision: str):
    from transformers import TrainerCallback

    rl = RlkitStep(precision)
    times = {"trl": [], "rlkit": []}

    class Alternate(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times["trl"].append(time.perf_counter() - self.t0)
            times["rlkit"].append(rl(state.global_step))
            print(f"step {state.global_step}: TRL {times['trl'][-1]:.1f} s, rlkit {times['rlkit'][-1]:.1f} s", flush=True)
            if state.global_step >= steps + 1:  # one warm-up step each
                control.should_training_stop = True

    trainer = trl_trainer(precision, [Alternate()])
    trainer.train()
    rl.svc.close()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    trl_tokens = GROUPS * G * (sum(lengths) / len(lengths)) if lengths else float("nan")
    return times, rl.sampled_tokens / len(times["rlkit"]), trl_tokens


def peak_rss(framework: str, precision: str) -> float:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--peak", framework, "--precision", precision], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


def _peak(framework: str, precision: str) -> None:
    if framework == "rlkit":
        step = RlkitStep(precision)
        step(0), step(1)
        step.svc.close()
    else:
        from transformers import TrainerCallback

        class Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                control.should_training_stop = state.global_step >= 2

        trl_trainer(precision, [Stop()]).train()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                        help="auto: what rlkit's precision=auto picks on this machine, used by both frameworks")
    parser.add_argument("--peak", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak:
        return _peak(args.peak, args.precision)
    import statistics

    import torch

    from rlkit.backends.local.precision import resolve_precision

    choice = resolve_precision(args.precision, torch.device("cpu"))
    print(f"precision={args.precision}: {choice.precision} ({choice.reason})", flush=True)
    args.precision = choice.precision

    # Peaks first, each in its own process: the alternating run below holds both frameworks
    # (TRL's step alone peaks near 18 GB here), so a peak measured after it would not fit in memory.
    mem = {f: peak_rss(f, args.precision) for f in ("trl", "rlkit")}
    print(f"peak RSS: TRL {mem['trl']:.2f} GB, rlkit {mem['rlkit']:.2f} GB", flush=True)
    times, rl_tokens, trl_tokens = alternate(args.steps, args.precision)
    trl_s = statistics.median(times["trl"][1:])
    rl_s = statistics.median(times["rlkit"][1:])
    print(f"\nGRPO step: {GROUPS} prompts x {G} completions x <= {MAX_NEW} new tokens, SmolLM2-135M-Instruct, LoRA r16, {args.precision}, "
          f"median of {len(times['trl']) - 1} alternating steps after a warm-up\n")
    print("| | TRL GRPOTrainer | rlkit local | rlkit / TRL |")
    print("|---|---|---|---|")
    print(f"| seconds per step | {trl_s:.1f} | {rl_s:.1f} | {trl_s / rl_s:.2f}x faster |")
    print(f"| sampled tokens per step (mean) | {trl_tokens:.0f} | {rl_tokens:.0f} | |")
    print(f"| sampled tokens/s of step | {trl_tokens / trl_s:.0f} | {rl_tokens / rl_s:.0f} | {(rl_tokens / rl_s) / (trl_tokens / trl_s):.2f}x |")
    print(f"| peak RSS, GB | {mem['trl']:.2f} | {mem['rlkit']:.2f} | {mem['rlkit'] / mem['trl']:.2f}x |")
    print(f"\nper-step seconds: TRL {[round(x, 1) for x in times['trl']]}, rlkit {[round(x, 1) for x in times['rlkit']]}")


if __name__ == "__main__":
    main()
