"""The same GRPO step in rlkit and in TRL's GRPOTrainer, side by side, in one run, on two workloads.

    pip install 'trl==1.16.0'   # benchmark-only dependency (bash scripts/install.sh bench)
    python benchmarks/rl_step_vs_trl.py [--steps 3] [--precision auto|fp32|bf16] [--workload addition|gsm8k|both]
    python benchmarks/rl_step_vs_trl.py --model tiny --steps 1 --groups 2 --group-size 2   # smoke (seconds)

Workloads (both by default, one after the other):

- ``addition`` (prompt-heavy): 8 problems of 2-digit addition, 3-shot chat turns + an ``a + b =``
  prefill (~140-token prompts), at most 32 new tokens (answers are ~5 tokens).
- ``gsm8k`` (completion-heavy): 8 GSM8K training problems from the shipped data, 2-shot chat turns
  (~600-token prompts), at most 128 new tokens (``--gsm8k-max-new``), scored by rlkit's GSM8K reward.

Same in both frameworks: the model (SmolLM2-135M-Instruct, the embedded default), the prompts
(TRL gets rlkit's rendered prompt text), 8 completions each at temperature 1, the reward function
(the task's own), LoRA r16/alpha32 on attention+MLP, AdamW lr 1e-5, GRPO advantages (group
mean/std), token-mean PPO-clip loss (TRL's default ``loss_type="dapo"``, beta=0), one optimizer
step per batch, the precision (``auto`` = what rlkit's ``precision=auto`` picks here, for both).
TRL keeps its defaults otherwise (gradient checkpointing on). The steps alternate: every TRL step
is followed by one rlkit step, timed from TRL's own step callbacks; the first of each is a warm-up.
Peak memory is measured per framework and workload in a fresh subprocess. Prints wall time per
step, tokens/s and peak RSS, with ratios.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

LR = 1e-5
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Workload:
    name: str
    max_new: int
    describe: str

    def task(self, groups: int):
        if self.name == "addition":
            from rlkit.tasks.arithmetic import ArithmeticTask

            return ArithmeticTask()
        from rlkit.tasks.gsm8k import GSM8KTask

        return GSM8KTask(num_shots=2, num_train=groups, num_test=1)

    def problems(self, groups: int):
        task = self.task(groups)
        return task, task.problems("train")[:groups]


def workloads(args) -> list:
    table = {
        "addition": Workload("addition", 32, "2-digit addition, 3-shot + prefill (prompt-heavy)"),
        "gsm8k": Workload("gsm8k", args.gsm8k_max_new, "GSM8K, 2-shot (completion-heavy)"),
    }
    return list(table.values()) if args.workload == "both" else [table[args.workload]]


def model_path(name: str) -> str:
    """A directory TRL can load ``name`` from (the embedded default's cached copy; the tiny test
    model saved once to a temporary directory)."""
    from rlkit.backends.local.models import _smollm2_cached_dir, canonical_name, load_model

    if canonical_name(name) != "tiny":
        return str(_smollm2_cached_dir()) if canonical_name(name) == "smollm2-135m-instruct" else name
    target = Path(tempfile.gettempdir()) / "rlkit-bench-tiny"
    if not (target / "config.json").exists():
        lm = load_model("tiny")
        lm.model.save_pretrained(target)
        lm.tokenizer.save_pretrained(target)
    return str(target)


class RlkitStep:
    """One synchronous GRPO step on the local backend (sample -> reward -> PPO -> optim -> publish)."""

    def __init__(self, args, workload: Workload):
        import rlkit

        self.rlkit, self.args, self.workload = rlkit, args, workload
        self.svc = rlkit.connect("local", precision=args.precision, device="cpu")
        self.trainer = self.svc.create_lora_training_client(args.model, rank=16, alpha=32, seed=0)
        self.tok = self.trainer.get_tokenizer()
        self.task, self.problems = workload.problems(args.groups)
        self.sampler = self.trainer.save_weights_and_get_sampling_client()
        self.sampled_tokens = 0
        self.steps = 0

    def __call__(self, step: int) -> float:
        from rlkit.losses import PPO, run_loss
        from rlkit.rl.advantages import compute_advantages
        from rlkit.rl.collect import RolloutPolicy, collect_groups
        from rlkit.rl.datums import trajectory_datum

        t0 = time.perf_counter()
        params = self.rlkit.SamplingParams(max_tokens=self.workload.max_new, temperature=1.0)
        envs = [self.task.env_group(p, self.tok) for p in self.problems]
        groups = collect_groups(self.sampler, envs, self.args.group_size, params, RolloutPolicy(),
                                seeds=[step * 100 + i for i in range(len(envs))])
        data = []
        for g in groups:
            data += [trajectory_datum(t, a, 1.0) for t, a in zip(g.trajectories, compute_advantages(g.rewards))]
            self.sampled_tokens += g.decode_tokens
        run_loss(self.trainer, data, PPO(), aggregation="token_mean")
        self.trainer.optim_step(self.rlkit.AdamParams(learning_rate=LR, weight_decay=0.0)).result()
        self.sampler = self.trainer.save_weights_and_get_sampling_client()
        self.steps += 1
        return time.perf_counter() - t0


def trl_trainer(args, workload: Workload, callbacks=()):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    path = model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    task, probs = workload.problems(args.groups)
    prompts = [tok.decode(task.prompt(p, tok)) for p in probs]
    dataset = Dataset.from_dict({"prompt": prompts * 50, "index": list(range(len(probs))) * 50})

    def reward(completions, index, **_):
        out = []
        for c, i in zip(completions, index):
            r = task.reward(c, probs[i])
            out.append(float(getattr(r, "reward", r)))
        return out

    config = GRPOConfig(
        output_dir=os.path.join(tempfile.gettempdir(), "rlkit-trl-bench"), use_cpu=True, bf16=args.precision == "bf16",
        learning_rate=LR, weight_decay=0.0, per_device_train_batch_size=args.groups * args.group_size,
        num_generations=args.group_size, max_completion_length=workload.max_new, temperature=1.0,
        max_steps=10_000, logging_steps=1, save_strategy="no", report_to=[], seed=0, shuffle_dataset=False,
    )
    model = AutoModelForCausalLM.from_pretrained(path)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, lora_dropout=0.0)
    return GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tok, peft_config=lora, callbacks=list(callbacks))


def alternate(args, workload: Workload):
    from transformers import TrainerCallback

    rl = RlkitStep(args, workload)
    times = {"trl": [], "rlkit": []}

    class Alternate(TrainerCallback):
        def on_step_begin(self, _args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, control, **kw):
            times["trl"].append(time.perf_counter() - self.t0)
            times["rlkit"].append(rl(state.global_step))
            print(f"[{workload.name}] step {state.global_step}: TRL {times['trl'][-1]:.1f} s, rlkit {times['rlkit'][-1]:.1f} s", flush=True)
            if state.global_step >= args.steps + 1:  # one warm-up step each
                control.should_training_stop = True

    trainer = trl_trainer(args, workload, [Alternate()])
    trainer.train()
    rl.svc.close()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    trl_tokens = args.groups * args.group_size * (sum(lengths) / len(lengths)) if lengths else float("nan")
    return times, rl.sampled_tokens / max(rl.steps, 1), trl_tokens


def forwarded(args) -> list:
    return ["--precision", args.precision, "--model", args.model, "--groups", str(args.groups), "--group-size", str(args.group_size),
            "--gsm8k-max-new", str(args.gsm8k_max_new)]


def peak_rss(framework: str, workload: Workload, args) -> float:
    cmd = [sys.executable, os.path.abspath(__file__), "--peak", framework, "--workload", workload.name, *forwarded(args)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return float(out.stdout.strip().splitlines()[-1])


def _peak(framework: str, args) -> None:
    workload = workloads(args)[0]
    if framework == "rlkit":
        step = RlkitStep(args, workload)
        step(0), step(1)
        step.svc.close()
    else:
        from transformers import TrainerCallback

        class Stop(TrainerCallback):
            def on_step_end(self, _args, state, control, **kw):
                control.should_training_stop = state.global_step >= 2

        trl_trainer(args, workload, [Stop()]).train()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2)


def report(args, workload: Workload, times, rl_tokens, trl_tokens, mem) -> float:
    measured = max(len(times["trl"]) - 1, 1)
    trl_s = statistics.median(times["trl"][1:] or times["trl"])
    rl_s = statistics.median(times["rlkit"][1:] or times["rlkit"])
    print(f"\n{workload.name}: {workload.describe}; GRPO step: {args.groups} prompts x {args.group_size} completions x <= {workload.max_new} "
          f"new tokens, {args.model}, LoRA r16, {args.precision}, median of {measured} alternating steps after a warm-up\n")
    print("| | TRL GRPOTrainer | rlkit local | rlkit / TRL |")
    print("|---|---|---|---|")
    print(f"| seconds per step | {trl_s:.1f} | {rl_s:.1f} | {trl_s / rl_s:.2f}x faster |")
    print(f"| sampled tokens per step (mean) | {trl_tokens:.0f} | {rl_tokens:.0f} | |")
    print(f"| sampled tokens/s of step | {trl_tokens / trl_s:.0f} | {rl_tokens / rl_s:.0f} | {(rl_tokens / rl_s) / (trl_tokens / trl_s):.2f}x |")
    if mem:
        print(f"| peak RSS, GB | {mem['trl']:.2f} | {mem['rlkit']:.2f} | {mem['rlkit'] / mem['trl']:.2f}x |")
    print(f"\nper-step seconds: TRL {[round(x, 1) for x in times['trl']]}, rlkit {[round(x, 1) for x in times['rlkit']]}")
    return trl_s / rl_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per workload (after one warm-up step)")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                        help="auto: what rlkit's precision=auto picks on this machine, used by both frameworks")
    parser.add_argument("--workload", default="both", choices=["addition", "gsm8k", "both"])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="smollm2-135m-instruct (default) or tiny (smoke runs)")
    parser.add_argument("--groups", type=int, default=8, help="problems per step")
    parser.add_argument("--group-size", type=int, default=8, help="completions per problem")
    parser.add_argument("--gsm8k-max-new", type=int, default=128, help="new tokens per gsm8k completion (>= 128 for the measurement)")
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--peak", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak:
        return _peak(args.peak, args)
    import torch

    from rlkit.backends.local.precision import resolve_precision

    choice = resolve_precision(args.precision, torch.device("cpu"))
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"precision={args.precision}: {choice.precision} ({choice.reason})", flush=True)
    args.precision = choice.precision
    ratios = {}
    for workload in workloads(args):
        # Peaks first, each in its own process: the alternating run holds both frameworks (TRL's
        # step alone peaks near 18 GB on the addition workload), so a peak measured after it would
        # not fit in memory.
        mem = None if args.no_peak else {f: peak_rss(f, workload, args) for f in ("trl", "rlkit")}
        if mem:
            print(f"[{workload.name}] peak RSS: TRL {mem['trl']:.2f} GB, rlkit {mem['rlkit']:.2f} GB", flush=True)
        times, rl_tokens, trl_tokens = alternate(args, workload)
        ratios[workload.name] = report(args, workload, times, rl_tokens, trl_tokens, mem)
        gc.collect()
    print("\nrlkit / TRL, seconds per step: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
