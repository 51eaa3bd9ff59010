"""One GRPO step on a device: rlkit vs the same step written with HF ``generate`` + PEFT, alternating.

    python benchmarks/rl_step_vs_hf.py --device cuda --model DIR [--steps 3] [--precision auto]
    python benchmarks/rl_step_vs_hf.py --device cpu --model tiny --steps 1 --groups 2 --group-size 2 --max-new 8   # smoke

The step (both sides): 8 GSM8K training prompts (2-shot chat turns, rendered by rlkit's GSM8K task
with the model's tokenizer), 8 completions each at temperature 1 with at most ``--max-new`` new
tokens, a reward, GRPO advantages (group mean/std), token-mean PPO-clip loss over the completions
(one optimizer step, so the ratio is 1 and ``old = new.detach()``), AdamW lr 1e-5, LoRA r16/alpha32
on attention and MLP. The reward is synthetic — the fraction of a completion's tokens that are
even ids — because ``gpu_check.sh`` runs random-weight models: it has variance, so every row
carries gradient. The HF side: ``model.generate(num_return_sequences=8)`` on the PEFT model, then
forward/backward in micro-batches of 8 rows (bf16 autocast when the precision is bf16). Prints
seconds per step, sampled tokens/s, the fraction of the device's bf16 matmul peak (6 x matmul
parameters per trained token + 2 x per sampled token), and peak memory (GPU: allocated; CPU: RSS).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

LR = 1e-5
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def synthetic_reward(tokens) -> float:
    return sum(1 for t in tokens if t % 2 == 0) / max(len(tokens), 1)


def advantages(rewards):
    from rlkit.rl.advantages import compute_advantages

    return compute_advantages(rewards)


def prompts_for(tokenizer, groups: int):
    from rlkit.tasks.gsm8k import GSM8KTask

    task = GSM8KTask(num_shots=2, num_train=groups, num_test=1)
    return [task.prompt(p, tokenizer) for p in task.problems("train")[:groups]]


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class RlkitStep:
    def __init__(self, args):
        import rlkit

        self.rlkit, self.args = rlkit, args
        self.svc = rlkit.connect("local", precision=args.precision, device=args.device)
        self.trainer = self.svc.create_lora_training_client(args.model, rank=16, alpha=32, seed=0)
        self.prompts = prompts_for(self.trainer.get_tokenizer(), args.groups)
        self.sampler = self.trainer.save_weights_and_get_sampling_client()

    def __call__(self, step: int):
        from rlkit.losses import PPO, run_loss
        from rlkit.rl.datums import trajectory_datum
        from rlkit.tasks.base import Trajectory, Transition

        t0 = time.perf_counter()
        params = [self.rlkit.SamplingParams(max_tokens=self.args.max_new, temperature=1.0, seed=step * 100 + i) for i in range(len(self.prompts))]
        futures = [self.sampler.sample(p, num_samples=self.args.group_size, sampling_params=sp) for p, sp in zip(self.prompts, params)]
        data, sampled = [], 0
        for prompt, future in zip(self.prompts, futures):
            seqs = future.result().sequences
            sampled += sum(len(s.tokens) for s in seqs)
            trajectories = [Trajectory(transitions=[Transition(observation=list(prompt), action=list(s.tokens), action_logprobs=list(s.logprobs))]) for s in seqs]
            for t, a in zip(trajectories, advantages([synthetic_reward(s.tokens) for s in seqs])):
                data.append(trajectory_datum(t, a, 1.0))
        trained = sum(d.model_input.length for d in data)
        run_loss(self.trainer, data, PPO(), aggregation="token_mean")
        self.trainer.optim_step(self.rlkit.AdamParams(learning_rate=LR, weight_decay=0.0)).result()
        self.sampler = self.trainer.save_weights_and_get_sampling_client()
        return time.perf_counter() - t0, sampled, trained


class HFStep:
    """The same step with ``transformers.generate`` and a PEFT LoRA model."""

    def __init__(self, args):
        import torch
        from peft import LoraConfig, get_peft_model

        from rlkit.backends.local.models import load_model

        self.args = args
        lm = load_model(args.model)
        torch.manual_seed(0)
        self.model = get_peft_model(lm.model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, lora_dropout=0.0)).to(args.device)
        self.tok = lm.tokenizer
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.stop = set(lm.stop_token_ids)
        self.prompts = prompts_for(self.tok, args.groups)
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)

    def autocast(self):
        import torch

        if self.args.precision == "bf16":
            return torch.autocast(torch.device(self.args.device).type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def __call__(self, step: int):
        import torch

        args, G = self.args, self.args.group_size
        t0 = time.perf_counter()
        width = max(len(p) for p in self.prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + list(p) for p in self.prompts], device=args.device)
        mask = (ids != -1).long()
        for i, p in enumerate(self.prompts):
            mask[i, : width - len(p)] = 0
        torch.manual_seed(step)
        self.model.eval()
        with torch.no_grad(), self.autocast():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, max_new_tokens=args.max_new,
                                      num_return_sequences=G, pad_token_id=self.pad)
        rows, completions = [], []
        for r, row in enumerate(out[:, width:].tolist()):
            toks = []
            for t in row:
                toks.append(t)
                if t in self.stop:
                    break
            prompt = list(self.prompts[r // G])
            rows.append(prompt + toks)
            completions.append((len(prompt), toks))
        rewards = [synthetic_reward(toks) for _, toks in completions]
        adv = []
        for g in range(len(self.prompts)):
            adv += advantages(rewards[g * G : (g + 1) * G])
        n_tokens = sum(len(t) for _, t in completions)
        self.model.train()
        for start in range(0, len(rows), 8):  # micro-batches of 8 rows: the logits of 64 rows do not fit
            batch = rows[start : start + 8]
            w = max(len(r) for r in batch)
            x = torch.tensor([r + [self.pad] * (w - len(r)) for r in batch], device=args.device)
            m = torch.tensor([[1] * len(r) + [0] * (w - len(r)) for r in batch], device=args.device)
            with self.autocast():
                logits = self.model(input_ids=x, attention_mask=m).logits[:, :-1].float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)
            weight = torch.zeros_like(logp)
            a = torch.zeros_like(logp)
            for j, (plen, toks) in enumerate(completions[start : start + 8]):
                weight[j, plen - 1 : plen - 1 + len(toks)] = 1.0
                a[j] = adv[start + j]
            ratio = torch.exp(logp - logp.detach())
            loss = -(torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a) * weight).sum() / n_tokens
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        sync(args.device)
        return time.perf_counter() - t0, n_tokens, sum(len(r) for r in rows)


def matmul_params(model: str) -> int:
    """Matrix-multiply parameters of ``model`` (a directory is read on the meta device: no weights)."""
    import torch

    if os.path.isdir(model):
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    else:
        from rlkit.backends.local.models import load_model

        lm = load_model(model).model
    return sum(m.weight.numel() for m in lm.modules() if isinstance(m, torch.nn.Linear))


def bf16_peak(device: str) -> float:
    import torch

    size = 8192 if device.startswith("cuda") else 1024
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ a
    sync(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        a @ a
        n += 1
        if n % 8 == 0:
            sync(device)
    sync(device)
    return 2 * size**3 * n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", required=True, help="a model directory (gpu_models.py) or a name load_model knows")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up step each)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=128)
    args = parser.parse_args()
    import torch

    from rlkit.backends.local.precision import resolve_precision

    choice = resolve_precision(args.precision, torch.device(args.device))
    args.precision = choice.precision
    peak = bf16_peak(args.device)
    params = matmul_params(args.model)
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name(torch.device(args.device)) if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; bf16 matmul peak {peak / 1e12:.1f} TFLOP/s; model {args.model} ({params / 1e6:.0f}M matmul parameters); "
          f"precision {args.precision} ({choice.reason})", flush=True)
    results = {}
    for label, make in (("HF generate + PEFT", HFStep), ("rlkit", RlkitStep)):
        results[label] = {"step": make(args), "times": [], "sampled": [], "trained": [], "peak": 0.0}
    for step in range(args.steps + 1):  # alternate, one warm-up step each
        for label, r in results.items():
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            seconds, sampled, trained = r["step"](step)
            if cuda:
                r["peak"] = max(r["peak"], torch.cuda.max_memory_allocated() / 1024**3)
            if step:
                r["times"].append(seconds)
                r["sampled"].append(sampled)
                r["trained"].append(trained)
            print(f"step {step} {label}: {seconds:.2f} s, {sampled} sampled tokens", flush=True)
    print(f"\nGRPO step, {args.groups} x {args.group_size} x <= {args.max_new} new tokens, median of {args.steps} after a warm-up\n")
    print("| | HF generate + PEFT | rlkit | rlkit / HF |")
    print("|---|---|---|---|")
    rows = {}
    for label, r in results.items():
        s = statistics.median(r["times"])
        sampled, trained = statistics.mean(r["sampled"]), statistics.mean(r["trained"])
        rows[label] = (s, sampled / s, (6 * params * trained + 2 * params * sampled) / s / peak)
    (hs, ht, hf), (rs, rt, rf) = rows["HF generate + PEFT"], rows["rlkit"]
    print(f"| seconds per step | {hs:.2f} | {rs:.2f} | {hs / rs:.2f}x faster |")
    print(f"| sampled tokens/s of step | {ht:.0f} | {rt:.0f} | {rt / ht:.2f}x |")
    print(f"| fraction of bf16 matmul peak | {hf:.1%} | {rf:.1%} | |")
    if cuda:
        hp, rp = results["HF generate + PEFT"]["peak"], results["rlkit"]["peak"]
        print(f"| peak GPU memory allocated during the step (both sides' models resident), GiB | {hp:.1f} | {rp:.1f} | {rp / hp:.2f}x |")
    else:
        print(f"| peak RSS of the process (both sides), GiB | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2:.1f} | | |")


if __name__ == "__main__":
    main()
