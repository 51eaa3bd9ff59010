"""Session throughput on the embedded default model: rlkit's local backend next to the code a user
would otherwise write (plain transformers + peft), in one run, as ratios.

    python benchmarks/session_throughput.py            # full table (~10 min on 2 CPU cores)
    python benchmarks/session_throughput.py --quick    # fewer repeats
    python benchmarks/session_throughput.py --device cuda --model DIR   # on a GPU (benchmarks/gpu_check.sh)

Rows:
- training step (forward_backward + optim_step, 16 x 256 = 4,096 tokens of SFT data): tokens/s,
  rlkit fp32 and bf16 vs HF+PEFT fp32 (model(labels=...) -> backward -> AdamW), and the fraction of
  this CPU's matmul peak (measured here, fp32 and bf16) each reaches;
- group sampling (8 prompts x 8 samples x 64 new tokens, temperature 1): tokens/s, rlkit vs
  ``model.generate(num_return_sequences=8)``, and the fraction of the matmul peak it reaches
  (2 x the matmul parameters per token); and batch-1 greedy decode (median of 3);
- peak memory of one 16 x 256 LoRA step: RSS, each measured in a fresh subprocess (on a GPU:
  ``torch.cuda.max_memory_allocated``, in-process);
- sampler-vs-trainer logprob mismatch: mean |logp_trainer - logp_sampler| on sampled tokens.

Every number is measured in this run; nothing is hard-coded. On a GPU (``--device cuda``) every
measurement runs in this process, one after the other, each with the GPU's peak-memory counter
reset; ``--model`` takes a model directory (``gpu_check.sh`` writes random-weight ones).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any, Dict

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "smollm2-135m-instruct"
DEVICE = "cpu"
IN_PROCESS = False  # every measurement in this process (always on a GPU)
ROWS, SEQ = 16, 256
PROMPTS, GROUP, NEW_TOKENS = 8, 8, 64


def sft_batch(tokenizer):
    """16 real GSM8K conversations, each cut/padded to exactly 256 tokens (no padding waste)."""
    from rlkit.chat import render_conversation
    from rlkit.data import load_records, gsm8k_messages

    records = load_records("gsm8k/train.jsonl", limit=64)
    seqs = []
    for r in records:
        rendered = render_conversation(tokenizer, gsm8k_messages(r))
        toks = rendered.tokens
        while len(toks) < SEQ:
            toks = toks + rendered.tokens
        seqs.append(toks[:SEQ])
        if len(seqs) == ROWS:
            break
    return seqs


def rlkit_datums(seqs):
    from rlkit.chat import datum_from_tokens

    return [datum_from_tokens(s, [1.0] * len(s)) for s in seqs]


def sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak(dtype_name: str, seconds: float = 2.0) -> float:
    import torch

    dtype = getattr(torch, dtype_name)
    size = 8192 if DEVICE.startswith("cuda") else 1024
    a = torch.randn(size, size, dtype=dtype, device=DEVICE)
    b = torch.randn(size, size, dtype=dtype, device=DEVICE)
    for _ in range(3):
        a @ b
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
        if n % 8 == 0:
            sync()
    sync()
    return 2 * size**3 * n / (time.perf_counter() - t0)


def matmul_params(model) -> int:
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def flops_per_token(model) -> float:
    """Forward 2N + backward 2N (activation gradients; frozen base weights get none) + the LoRA
    weight gradients, with N the matmul parameters (transformer linears + the output layer)."""
    import torch

    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 4.0 * n


# -- measurements ----------------------------------------------------------------------------------------


def time_rlkit_train(precision: str, repeats: int):
    import rlkit

    svc = rlkit.connect("local", precision=precision, device=DEVICE)
    tc = svc.create_lora_training_client(MODEL, rank=32, alpha=64, seed=0)
    data = rlkit_datums(sft_batch(tc.get_tokenizer()))
    tc.forward_backward(data).result()  # warm-up
    tc.optim_step().result()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tc.forward_backward(data)
        tc.optim_step().result()
        times.append(time.perf_counter() - t0)
    lm = tc._engine.causal_lm
    svc.close()
    return min(times), lm


def hf_peft_model(dtype=None):
    import torch
    from peft import LoraConfig, get_peft_model

    from rlkit.backends.local.models import load_model

    lm = load_model(MODEL, device=DEVICE)
    config = LoraConfig(r=32, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], lora_dropout=0.0)
    model = get_peft_model(lm.model, config)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt, lm.tokenizer


def time_hf_train(repeats: int):
    import torch

    model, opt, tokenizer = hf_peft_model()
    ids = torch.tensor(sft_batch(tokenizer), device=DEVICE)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        sync()
        if i:
            times.append(time.perf_counter() - t0)
    return min(times)


def group_prompts(tokenizer):
    from rlkit.chat import prompt_tokens
    from rlkit.data import load_records

    records = load_records("gsm8k/test.jsonl", limit=PROMPTS)
    return [prompt_tokens(tokenizer, [{"role": "user", "content": r["question"]}]) for r in records]


def time_rlkit_sampling(precision: str):
    import rlkit

    svc = rlkit.connect("local", precision=precision, device=DEVICE)
    sc = svc.create_sampling_client(base_model=MODEL)
    prompts = group_prompts(sc.get_tokenizer())
    params = rlkit.SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=0)
    sc.sample(prompts[0], num_samples=2, sampling_params=rlkit.SamplingParams(max_tokens=4)).result()  # warm-up
    t0 = time.perf_counter()
    futures = [sc.sample(p, num_samples=GROUP, sampling_params=params) for p in prompts]
    decoded = sum(f.result().usage.decode_tokens for f in futures)
    group_s = time.perf_counter() - t0
    singles = []
    for _ in range(3):
        t0 = time.perf_counter()
        one = sc.sample(prompts[0], sampling_params=rlkit.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)).result()
        singles.append(len(one.sequences[0].tokens) / (time.perf_counter() - t0))
    path = next(iter(svc._runtimes.values())).sampler.sampler.decode_path
    svc.close()
    return decoded / group_s, statistics.median(singles), path


def time_hf_generate(dtype_name: str):
    import torch

    from rlkit.backends.local.models import load_model

    lm = load_model(MODEL, device=DEVICE)
    model = lm.model.to(getattr(torch, dtype_name)).eval()
    tok = lm.tokenizer
    tok.padding_side = "left"
    prompts = group_prompts(tok)
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=DEVICE)
    mask = (torch.arange(width).unsqueeze(0) >= torch.tensor([width - len(p) for p in prompts]).unsqueeze(1)).long().to(DEVICE)
    with torch.inference_mode():
        model.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=4, do_sample=False)
        sync()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, max_new_tokens=NEW_TOKENS,
                             num_return_sequences=GROUP, pad_token_id=pad)
        sync()
        group_s = time.perf_counter() - t0
        new = out[:, width:]
        eos = set(lm.stop_token_ids)
        decoded = 0
        for row in new.tolist():
            n = 0
            for t in row:
                n += 1
                if t in eos:
                    break
            decoded += n
        one_ids = torch.tensor([prompts[0]], device=DEVICE)
        singles = []
        for _ in range(3):
            t0 = time.perf_counter()
            one = model.generate(input_ids=one_ids, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=pad)
            sync()
            singles.append((one.shape[1] - one_ids.shape[1]) / (time.perf_counter() - t0))
    return decoded / group_s, statistics.median(singles)


def mismatch(precision: str) -> float:
    import torch

    import rlkit
    from rlkit.types import Datum, ModelInput

    svc = rlkit.connect("local", precision=precision, device=DEVICE)
    tc = svc.create_lora_training_client(MODEL, rank=32, alpha=64, seed=0)
    sc = tc.save_weights_and_get_sampling_client()
    prompts = group_prompts(tc.get_tokenizer())[:4]
    diffs = []
    for p in prompts:
        seqs = sc.sample(p, num_samples=4, sampling_params=rlkit.SamplingParams(max_tokens=32, temperature=1.0, seed=1)).result().sequences
        data = []
        for s in seqs:
            toks = p + s.tokens
            data.append(Datum(model_input=ModelInput.from_ints(toks), loss_fn_inputs={"target_tokens": toks[1:] + [0], "weights": [0.0] * len(toks)}))
        outs = tc.forward(data).result().loss_fn_outputs
        for s, o in zip(seqs, outs):
            lp = o["logprobs"].to_torch()[len(p) - 1 : len(p) - 1 + len(s.tokens)]
            diffs.append((lp - torch.tensor(s.logprobs)).abs())
    svc.close()
    return float(torch.cat(diffs).mean())


def common_args() -> list:
    return ["--model", MODEL, "--device", DEVICE]


def peak_rss_gb(kind: str) -> float:
    """Run one 16x256 step in a fresh process and return its peak RSS (on a GPU: in this
    process, the peak of GPU memory allocated during the step)."""
    if DEVICE.startswith("cuda"):
        import torch

        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        _one_step(kind, report=False)
        return torch.cuda.max_memory_allocated() / 1024**3
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one-step", kind, *common_args()], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def in_subprocess(name: str, *args: Any) -> Any:
    """``name(*args)`` in a fresh Python process (each measurement gets its own memory; the HF
    baseline step alone peaks above 10 GB), its result returned as JSON."""
    if IN_PROCESS:  # one process holds the GPU; each call frees what it made
        import torch

        result = json.loads(json.dumps(globals()[name](*args)))
        gc.collect()
        if DEVICE.startswith("cuda"):
            torch.cuda.empty_cache()
        return result
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--call", json.dumps([name, list(args)]), *common_args()],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{name}{args}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _train(kind: str, repeats: int) -> Dict[str, float]:
    if kind == "hf":
        return {"seconds": time_hf_train(repeats)}
    seconds, lm = time_rlkit_train(kind, repeats)
    return {"seconds": seconds, "flops_per_token": flops_per_token(lm)}


def _one_step(kind: str, report: bool = True) -> None:
    if kind.startswith("rlkit"):
        import rlkit

        svc = rlkit.connect("local", precision=kind.split("-")[1], device=DEVICE)
        tc = svc.create_lora_training_client(MODEL, rank=32, alpha=64)
        tc.forward_backward(rlkit_datums(sft_batch(tc.get_tokenizer())))
        tc.optim_step().result()
        svc.close()
    else:
        import torch

        model, opt, tokenizer = hf_peft_model()
        ids = torch.tensor(sft_batch(tokenizer), device=DEVICE)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        sync()
    if report:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2)


def main() -> None:
    global MODEL, DEVICE, IN_PROCESS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--model", default=MODEL, help="a model name load_model knows, or a model directory")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: where rlkit and the baselines run")
    parser.add_argument("--in-process", action="store_true", help="time every measurement in this process (always so on a GPU; "
                        "on the CPU peak memory still gets fresh processes)")
    parser.add_argument("--one-step", help=argparse.SUPPRESS)
    parser.add_argument("--call", help=argparse.SUPPRESS)
    args = parser.parse_args()
    MODEL, DEVICE = args.model, args.device
    IN_PROCESS = args.in_process or DEVICE.startswith("cuda")
    if args.one_step:
        return _one_step(args.one_step)
    if args.call:
        name, call_args = json.loads(args.call)
        print(json.dumps(globals()[name](*call_args)))
        return None
    import torch

    repeats = 1 if args.quick else 3
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if DEVICE.startswith("cuda"):
        machine = f"{torch.cuda.get_device_name(torch.device(DEVICE))} ({DEVICE}); host {machine}"
    results = {"machine": machine, "model": MODEL, "device": DEVICE}
    peak32, peak16 = matmul_peak("float32"), matmul_peak("bfloat16")
    results["matmul_peak_gflops"] = {"fp32": peak32 / 1e9, "bf16": peak16 / 1e9}
    from rlkit.backends.local.precision import resolve_precision

    auto = resolve_precision("auto", torch.device(DEVICE))
    results["precision_auto"] = {"chosen": auto.precision, "reason": auto.reason}
    print(f"precision=auto chooses {auto.precision} on this machine ({auto.reason})", flush=True)

    results["peak_rss_gb"] = {k: peak_rss_gb(k) for k in ("hf", "rlkit-fp32", "rlkit-bf16")}
    hf_s = in_subprocess("_train", "hf", repeats)["seconds"]
    r32 = in_subprocess("_train", "fp32", repeats)
    r32_s, fpt = r32["seconds"], r32["flops_per_token"]
    r16_s = in_subprocess("_train", "bf16", repeats)["seconds"]
    tokens = ROWS * SEQ
    results["train"] = {
        "hf_peft_fp32_tok_s": tokens / hf_s,
        "rlkit_fp32_tok_s": tokens / r32_s,
        "rlkit_bf16_tok_s": tokens / r16_s,
        "hf_peft_fp32_peak_frac": tokens * fpt / hf_s / peak32,
        "rlkit_fp32_peak_frac": tokens * fpt / r32_s / peak32,
        "rlkit_bf16_peak_frac": tokens * fpt / r16_s / peak16,
    }
    g_hf, one_hf = in_subprocess("time_hf_generate", "float32")
    g_hf16, one_hf16 = in_subprocess("time_hf_generate", "bfloat16")
    g32, one32, path32 = in_subprocess("time_rlkit_sampling", "fp32")
    g16, one16, path16 = in_subprocess("time_rlkit_sampling", "bf16")
    results["decode_path"] = {"fp32": path32, "bf16": path16}
    sample_flops = fpt / 2  # forward only: 2 x matmul parameters per token
    results["sampling_peak_frac"] = {"hf_generate_fp32": g_hf * sample_flops / peak32, "hf_generate_bf16": g_hf16 * sample_flops / peak16,
                                     "rlkit_fp32": g32 * sample_flops / peak32, "rlkit_bf16": g16 * sample_flops / peak16}
    results["sampling"] = {
        "hf_generate_fp32_group_tok_s": g_hf, "hf_generate_bf16_group_tok_s": g_hf16,
        "rlkit_fp32_group_tok_s": g32, "rlkit_bf16_group_tok_s": g16,
        "hf_generate_fp32_batch1_tok_s": one_hf, "hf_generate_bf16_batch1_tok_s": one_hf16,
        "rlkit_fp32_batch1_tok_s": one32, "rlkit_bf16_batch1_tok_s": one16,
    }
    results["mismatch"] = {"fp32": in_subprocess("mismatch", "fp32"), "bf16": in_subprocess("mismatch", "bf16")}

    t, s, m, f = results["train"], results["sampling"], results["peak_rss_gb"], results["sampling_peak_frac"]
    memory = "peak GPU memory allocated" if DEVICE.startswith("cuda") else "peak RSS"
    print(f"\nmachine: {results['machine']}; model {MODEL}; matmul peak {peak32 / 1e9:.0f} GFLOP/s fp32, {peak16 / 1e9:.0f} GFLOP/s bf16")
    print(f"precision=auto (the default) chooses {auto.precision}: its numbers are the rlkit {auto.precision} column")
    print(f"rlkit decode: fp32 {path32}; bf16 {path16}\n")
    print("| measurement | baseline | rlkit fp32 | rlkit bf16 | ratio fp32 | ratio bf16 |")
    print("|---|---|---|---|---|---|")
    print(f"| train step 16x256, tok/s (baseline HF+PEFT fp32) | {t['hf_peft_fp32_tok_s']:.0f} | {t['rlkit_fp32_tok_s']:.0f} | {t['rlkit_bf16_tok_s']:.0f} | {t['rlkit_fp32_tok_s'] / t['hf_peft_fp32_tok_s']:.2f}x | {t['rlkit_bf16_tok_s'] / t['hf_peft_fp32_tok_s']:.2f}x |")
    print(f"| train step, fraction of matmul peak | {t['hf_peft_fp32_peak_frac']:.0%} | {t['rlkit_fp32_peak_frac']:.0%} | {t['rlkit_bf16_peak_frac']:.0%} | | |")
    print(f"| group sampling 8x8x64, tok/s (baseline generate fp32) | {s['hf_generate_fp32_group_tok_s']:.0f} | {s['rlkit_fp32_group_tok_s']:.0f} | {s['rlkit_bf16_group_tok_s']:.0f} | {s['rlkit_fp32_group_tok_s'] / s['hf_generate_fp32_group_tok_s']:.2f}x | {s['rlkit_bf16_group_tok_s'] / s['hf_generate_fp32_group_tok_s']:.2f}x |")
    print(f"| group sampling vs generate with bf16 weights | {s['hf_generate_bf16_group_tok_s']:.0f} | | {s['rlkit_bf16_group_tok_s']:.0f} | | {s['rlkit_bf16_group_tok_s'] / s['hf_generate_bf16_group_tok_s']:.2f}x |")
    print(f"| group sampling, fraction of matmul peak (generate fp32, bf16) | {f['hf_generate_fp32']:.1%}, {f['hf_generate_bf16']:.1%} | {f['rlkit_fp32']:.1%} | {f['rlkit_bf16']:.1%} | | |")
    print(f"| batch-1 greedy decode, tok/s (baseline generate fp32) | {s['hf_generate_fp32_batch1_tok_s']:.0f} | {s['rlkit_fp32_batch1_tok_s']:.0f} | {s['rlkit_bf16_batch1_tok_s']:.0f} | {s['rlkit_fp32_batch1_tok_s'] / s['hf_generate_fp32_batch1_tok_s']:.2f}x | {s['rlkit_bf16_batch1_tok_s'] / s['hf_generate_fp32_batch1_tok_s']:.2f}x |")
    print(f"| batch-1 greedy decode vs generate with bf16 weights | {s['hf_generate_bf16_batch1_tok_s']:.0f} | | {s['rlkit_bf16_batch1_tok_s']:.0f} | | {s['rlkit_bf16_batch1_tok_s'] / s['hf_generate_bf16_batch1_tok_s']:.2f}x |")
    print(f"| {memory} of a 16x256 LoRA step, GiB (baseline HF+PEFT fp32) | {m['hf']:.1f} | {m['rlkit-fp32']:.1f} | {m['rlkit-bf16']:.1f} | {m['rlkit-fp32'] / m['hf']:.2f}x | {m['rlkit-bf16'] / m['hf']:.2f}x |")
    print(f"| sampler-vs-trainer mean abs logprob diff | | {results['mismatch']['fp32']:.2e} | {results['mismatch']['bf16']:.2e} | | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
