"""rlkit vs HF ``generate`` + PEFT on one device, one arm per process (issue 26 item 4).

    python benchmarks/gpu_bench.py --arm rlkit --model DIR --json OUT/rlkit.json     # one arm
    python benchmarks/gpu_bench.py --arm hf    --model DIR --json OUT/hf.json
    python benchmarks/gpu_bench.py --table OUT/*.json --out benchmarks/results/gpu/TABLE.md
    python benchmarks/gpu_bench.py --smoke OUT_DIR          # both arms + table, CPU, tiny shapes (tests run this)

Each arm, in its own process (so its peak GPU memory is its own):

- **RL step**: the GRPO step of ``rl_step_vs_hf.py`` (``--groups`` prompts x ``--group-size``
  samples of at most ``--max-new`` tokens, PPO, AdamW, LoRA r16 on attention + MLP); seconds per
  step (median after one warm-up) and peak GPU memory allocated during it.
- **Decode**: tokens/s of ``--batches`` rows (one prompt, ``num_samples`` rows; HF:
  ``num_return_sequences``) decoding exactly ``--decode-tokens`` new tokens (stop tokens off), after
  one warm-up at that batch (rlkit captures its CUDA graphs there).
- **Training**: tokens/s of ``forward_backward`` (cross-entropy, every token weighted) over
  ``--train-rows`` x ``--train-len`` tokens + ``optim_step``, and MFU: model FLOPs
  ``6 N`` per token (``N`` = matrix-multiply parameters; the convention, though a LoRA backward
  skips the frozen weights' gradients, ~``4 N``) over the GPU's bf16 dense peak (the datasheet
  value for known GPUs, else the measured matmul peak; both are printed).

Nothing is estimated: every number in the table is measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: dense bf16 tensor-core peaks from the datasheets (FLOP/s), by a substring of the device name
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}
SMOKE = dict(device="cpu", model="tiny", steps=1, groups=1, group_size=2, max_new=4, batches=[1, 4], decode_tokens=4,
             train_rows=2, train_len=16, precision="fp32")


def datasheet_peak(name: str):
    for key, value in DATASHEET_BF16.items():
        if key in name:
            return value
    return None


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(fn, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


# -- the arms' decode and training measurements ------------------------------------------------------


def rlkit_decode(step, batch: int, n: int):
    import rlkit

    prompt = list(step.prompts[0])
    params = rlkit.SamplingParams(max_tokens=n, temperature=1.0, seed=batch)

    def run():
        step.sampler.sample(prompt, num_samples=batch, sampling_params=params, stop_token_ids=[]).result()

    return run


def hf_decode(step, batch: int, n: int, device: str):
    import torch

    prompt = torch.tensor([list(step.prompts[0])], device=device)

    def run():
        with torch.no_grad(), step.autocast():
            step.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                                max_new_tokens=n, min_new_tokens=n, num_return_sequences=batch, pad_token_id=step.pad)

    step.model.eval()
    return run


def train_tokens(rows: int, length: int, vocab: int):
    import random

    rng = random.Random(0)
    return [[rng.randrange(3, min(vocab, 500)) for _ in range(length)] for _ in range(rows)]


def rlkit_train(step, seqs):
    from rlkit.types import AdamParams, Datum, ModelInput

    data = [Datum(model_input=ModelInput.from_ints(s), loss_fn_inputs={"target_tokens": s[1:] + [0], "weights": [1.0] * (len(s) - 1) + [0.0]})
            for s in seqs]

    def run():
        step.trainer.forward_backward(data, "cross_entropy").result()
        step.trainer.optim_step(AdamParams(learning_rate=1e-5)).result()

    return run


def hf_train(step, seqs, device: str, budget: int = 2048):
    import torch

    rows_per = max(1, budget // len(seqs[0]))

    def run():
        step.model.train()
        for s in range(0, len(seqs), rows_per):
            x = torch.tensor(seqs[s:s + rows_per], device=device)
            with step.autocast():
                logits = step.model(input_ids=x).logits[:, :-1].float()
            loss = -torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).sum()
            loss.backward()
        step.opt.step()
        step.opt.zero_grad()

    return run


def run_arm(args) -> dict:
    import torch

    from rl_step_vs_hf import HFStep, RlkitStep, bf16_peak, matmul_params

    from rlkit.backends.local.precision import resolve_precision

    args.precision = resolve_precision(args.precision, torch.device(args.device)).precision
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name(torch.device(args.device)) if cuda else f"CPU, {torch.get_num_threads()} threads"
    out = {"arm": args.arm, "model": Path(args.model).name, "device": name, "precision": args.precision,
           "torch": torch.__version__, "matmul_params": matmul_params(args.model), "measured_bf16_peak": bf16_peak(args.device),
           "datasheet_bf16_peak": datasheet_peak(name)}
    t0 = time.perf_counter()
    step = (RlkitStep if args.arm == "rlkit" else HFStep)(args)
    out["load_s"] = time.perf_counter() - t0
    if args.arm == "rlkit":
        out["decode_path"] = step.sampler._runtime.sampler.sampler.decode_path
    times, peaks = [], []
    for i in range(args.steps + 1):
        peak_reset(args.device)
        sync(args.device)
        seconds, sampled, trained = step(i)
        sync(args.device)
        if i:
            times.append(seconds)
            peaks.append(peak_gib(args.device))
        print(f"{args.arm} RL step {i}: {seconds:.2f} s ({sampled} sampled, {trained} trained tokens)", file=sys.stderr, flush=True)
    out["rl_step_s"], out["rl_step_peak_gib"] = statistics.median(times), max(peaks)
    out["decode_tok_s"] = {}
    for batch in args.batches:
        fn = rlkit_decode(step, batch, args.decode_tokens) if args.arm == "rlkit" else hf_decode(step, batch, args.decode_tokens, args.device)
        fn()  # warm-up (rlkit: its CUDA graphs for this batch's buckets are captured here)
        seconds = timed(fn, args.device)
        out["decode_tok_s"][str(batch)] = batch * args.decode_tokens / seconds
        print(f"{args.arm} decode batch {batch}: {out['decode_tok_s'][str(batch)]:.0f} tok/s", file=sys.stderr, flush=True)
    vocab = int(step.trainer._engine.vocab_size) if args.arm == "rlkit" else int(step.model.config.vocab_size)
    seqs = train_tokens(args.train_rows, args.train_len, vocab)
    fn = rlkit_train(step, seqs) if args.arm == "rlkit" else hf_train(step, seqs, args.device)
    fn()  # warm-up
    peak_reset(args.device)
    seconds = timed(fn, args.device)
    tokens = args.train_rows * args.train_len
    out["train_tok_s"], out["train_peak_gib"] = tokens / seconds, peak_gib(args.device)
    peak = out["datasheet_bf16_peak"] or out["measured_bf16_peak"]
    out["train_mfu"] = 6 * out["matmul_params"] * tokens / seconds / peak
    return out


def _row(lines, hf, rl, label, key, fmt, better="higher", sub=None):
    """One table row: HF's value, rlkit's, and the ratio (``lower``: HF / rlkit for seconds)."""

    def get(r):
        if r is None:
            return None
        v = r[key]
        return v.get(sub) if sub is not None else v

    h, r = get(hf), get(rl)
    ratio = ""
    if h and r:
        ratio = f"{h / r:.2f}x faster" if better == "lower" and key.endswith("_s") else f"{r / h:.2f}x"
    lines.append(f"| {label} | {fmt.format(h) if h is not None else '—'} | {fmt.format(r) if r is not None else '—'} | {ratio} |")


def table(results) -> str:
    by = {}
    for r in results:
        by.setdefault(r["model"], {})[r["arm"]] = r
    first = results[0]
    mem = "peak RSS of the process, GiB" if first["device"].startswith("CPU") else "peak GPU memory allocated, GiB"
    sheet = f"{first['datasheet_bf16_peak'] / 1e12:.0f} TFLOP/s" if first["datasheet_bf16_peak"] else "unknown"
    lines = [f"Device: {first['device']}, torch {first['torch']}, precision {first['precision']}; bf16 peak: datasheet "
             f"{sheet}, measured matmul {first['measured_bf16_peak'] / 1e12:.3g} TFLOP/s "
             "(MFU against the datasheet value where known). Each arm in its own process; every number measured in this run.", ""]
    for model, arms in by.items():
        rl, hf = arms.get("rlkit"), arms.get("hf")
        lines += [f"### {model} ({(rl or hf)['matmul_params'] / 1e9:.2f}B matmul parameters)", ""]
        if rl:
            lines += [f"rlkit decode path: {rl.get('decode_path', '?')}", ""]
        lines += ["| | HF generate + PEFT | rlkit | rlkit vs HF |", "|---|---|---|---|"]

        _row(lines, hf, rl, "RL step, s (median)", "rl_step_s", "{:.2f}", better="lower")
        _row(lines, hf, rl, f"RL step {mem}", "rl_step_peak_gib", "{:.1f}", better="lower")
        for b in (rl or hf)["decode_tok_s"]:
            _row(lines, hf, rl, f"decode tok/s, batch {b}", "decode_tok_s", "{:.0f}", sub=b)
        _row(lines, hf, rl, "training tok/s", "train_tok_s", "{:.0f}")
        _row(lines, hf, rl, "training MFU (6N/token vs bf16 peak)", "train_mfu", "{:.1%}")
        _row(lines, hf, rl, f"training {mem}", "train_peak_gib", "{:.1f}", better="lower")
        lines.append("")
    return "\n".join(lines)


def smoke(out_dir: str) -> int:
    """Both arms and the table, on the CPU with tiny shapes: proves the script runs, measures nothing useful."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, __file__, "--device", "cpu", "--model", SMOKE["model"], "--precision", SMOKE["precision"],
            "--steps", str(SMOKE["steps"]), "--groups", str(SMOKE["groups"]), "--group-size", str(SMOKE["group_size"]),
            "--max-new", str(SMOKE["max_new"]), "--batches", *map(str, SMOKE["batches"]), "--decode-tokens", str(SMOKE["decode_tokens"]),
            "--train-rows", str(SMOKE["train_rows"]), "--train-len", str(SMOKE["train_len"])]
    files = []
    for arm in ("hf", "rlkit"):
        files.append(str(out / f"{arm}.json"))
        rc = subprocess.run(base + ["--arm", arm, "--json", files[-1]]).returncode
        if rc:
            return rc
    return subprocess.run([sys.executable, __file__, "--table", *files, "--out", str(out / "table.md")]).returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", choices=["rlkit", "hf"])
    ap.add_argument("--model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=120)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--train-rows", type=int, default=16)
    ap.add_argument("--train-len", type=int, default=512)
    ap.add_argument("--json", help="write this arm's results here")
    ap.add_argument("--table", nargs="+", help="merge these JSON results into a markdown table")
    ap.add_argument("--out", help="with --table: write the table here (also printed)")
    ap.add_argument("--smoke", metavar="OUT_DIR", help="both arms + table on the CPU at tiny shapes")
    args = ap.parse_args()
    if args.smoke:
        sys.exit(smoke(args.smoke))
    if args.table:
        text = table([json.loads(Path(p).read_text()) for p in args.table if Path(p).exists()])
        print(text)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n")
        return
    if not (args.arm and args.model):
        ap.error("--arm and --model (or --table, or --smoke)")
    result = run_arm(args)
    print(json.dumps(result), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
