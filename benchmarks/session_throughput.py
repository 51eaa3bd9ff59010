"""Session throughput on the embedded default model: rlkit's local backend next to the code a user
would otherwise write (plain transformers + peft), in one run, as ratios.

    python benchmarks/session_throughput.py            # full table (~10 min on 2 CPU cores)
    python benchmarks/session_throughput.py --quick    # fewer repeats

Rows:
- training step (forward_backward + optim_step, 16 x 256 = 4,096 tokens of SFT data): tokens/s,
  rlkit fp32 and bf16 vs HF+PEFT fp32 (model(labels=...) -> backward -> AdamW), and the fraction of
  this CPU's matmul peak (measured here, fp32 and bf16) each reaches;
- group sampling (8 prompts x 8 samples x 64 new tokens, temperature 1): tokens/s, rlkit vs
  ``model.generate(num_return_sequences=8)``; and batch-1 greedy decode;
- peak memory (RSS) of one 16 x 256 LoRA step, each measured in a fresh subprocess;
- sampler-vs-trainer logprob mismatch: mean |logp_trainer - logp_sampler| on sampled tokens.

Every number is measured in this run; nothing is hard-coded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import warnings
from typing import Any, Dict

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "smollm2-135m-instruct"
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


def matmul_peak(dtype_name: str, seconds: float = 2.0) -> float:
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(1024, 1024, dtype=dtype)
    b = torch.randn(1024, 1024, dtype=dtype)
    for _ in range(3):
        a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2 * 1024**3 * n / (time.perf_counter() - t0)


def flops_per_token(model) -> float:
    """Forward 2N + backward 2N (activation gradients; frozen base weights get none) + the LoRA
    weight gradients, with N the matmul parameters (transformer linears + the output layer)."""
    import torch

    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 4.0 * n


# -- measurements ----------------------------------------------------------------------------------------


def time_rlkit_train(precision: str, repeats: int):
    import rlkit

    svc = rlkit.connect("local", precision=precision)
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

    lm = load_model(MODEL)
    config = LoraConfig(r=32, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], lora_dropout=0.0)
    model = get_peft_model(lm.model, config)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt, lm.tokenizer


def time_hf_train(repeats: int):
    import torch

    model, opt, tokenizer = hf_peft_model()
    ids = torch.tensor(sft_batch(tokenizer))
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
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

    svc = rlkit.connect("local", precision=precision)
    sc = svc.create_sampling_client(base_model=MODEL)
    prompts = group_prompts(sc.get_tokenizer())
    params = rlkit.SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=0)
    sc.sample(prompts[0], num_samples=2, sampling_params=rlkit.SamplingParams(max_tokens=4)).result()  # warm-up
    t0 = time.perf_counter()
    futures = [sc.sample(p, num_samples=GROUP, sampling_params=params) for p in prompts]
    decoded = sum(f.result().usage.decode_tokens for f in futures)
    group_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    one = sc.sample(prompts[0], sampling_params=rlkit.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)).result()
    single_s = time.perf_counter() - t0
    svc.close()
    return decoded / group_s, len(one.sequences[0].tokens) / single_s


def time_hf_generate(dtype_name: str):
    import torch

    from rlkit.backends.local.models import load_model

    lm = load_model(MODEL)
    model = lm.model.to(getattr(torch, dtype_name)).eval()
    tok = lm.tokenizer
    tok.padding_side = "left"
    prompts = group_prompts(tok)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width).unsqueeze(0) >= torch.tensor([width - len(p) for p in prompts]).unsqueeze(1)).long()
    with torch.inference_mode():
        model.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=4, do_sample=False)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, max_new_tokens=NEW_TOKENS,
                             num_return_sequences=GROUP, pad_token_id=tok.pad_token_id)
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
        one_ids = torch.tensor([prompts[0]])
        t0 = time.perf_counter()
        one = model.generate(input_ids=one_ids, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=tok.pad_token_id)
        single_s = time.perf_counter() - t0
    return decoded / group_s, (one.shape[1] - one_ids.shape[1]) / single_s


def mismatch(precision: str) -> float:
    import torch

    import rlkit
    from rlkit.types import Datum, ModelInput

    svc = rlkit.connect("local", precision=precision)
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


def peak_rss_gb(kind: str) -> float:
    """Run one 16x256 step in a fresh process and return its peak RSS."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one-step", kind], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def in_subprocess(name: str, *args: Any) -> Any:
    """``name(*args)`` in a fresh Python process (each measurement gets its own memory; the HF
    baseline step alone peaks above 10 GB), its result returned as JSON."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--call", json.dumps([name, list(args)])], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{name}{args}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _train(kind: str, repeats: int) -> Dict[str, float]:
    if kind == "hf":
        return {"seconds": time_hf_train(repeats)}
    seconds, lm = time_rlkit_train(kind, repeats)
    return {"seconds": seconds, "flops_per_token": flops_per_token(lm)}


def _one_step(kind: str) -> None:
    if kind.startswith("rlkit"):
        import rlkit

        svc = rlkit.connect("local", precision=kind.split("-")[1])
        tc = svc.create_lora_training_client(MODEL, rank=32, alpha=64)
        tc.forward_backward(rlkit_datums(sft_batch(tc.get_tokenizer())))
        tc.optim_step().result()
    else:
        import torch

        model, opt, tokenizer = hf_peft_model()
        ids = torch.tensor(sft_batch(tokenizer))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--one-step", help=argparse.SUPPRESS)
    parser.add_argument("--call", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_step:
        return _one_step(args.one_step)
    if args.call:
        name, call_args = json.loads(args.call)
        print(json.dumps(globals()[name](*call_args)))
        return None
    import torch

    repeats = 1 if args.quick else 3
    results = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"}
    peak32, peak16 = matmul_peak("float32"), matmul_peak("bfloat16")
    results["matmul_peak_gflops"] = {"fp32": peak32 / 1e9, "bf16": peak16 / 1e9}
    from rlkit.backends.local.precision import resolve_precision

    auto = resolve_precision("auto", torch.device("cpu"))
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
    g32, one32 = in_subprocess("time_rlkit_sampling", "fp32")
    g16, one16 = in_subprocess("time_rlkit_sampling", "bf16")
    results["sampling"] = {
        "hf_generate_fp32_group_tok_s": g_hf, "hf_generate_bf16_group_tok_s": g_hf16,
        "rlkit_fp32_group_tok_s": g32, "rlkit_bf16_group_tok_s": g16,
        "hf_generate_fp32_batch1_tok_s": one_hf, "hf_generate_bf16_batch1_tok_s": one_hf16,
        "rlkit_fp32_batch1_tok_s": one32, "rlkit_bf16_batch1_tok_s": one16,
    }
    results["mismatch"] = {"fp32": in_subprocess("mismatch", "fp32"), "bf16": in_subprocess("mismatch", "bf16")}

    t, s, m = results["train"], results["sampling"], results["peak_rss_gb"]
    print(f"\nmachine: {results['machine']}; matmul peak {peak32 / 1e9:.0f} GFLOP/s fp32, {peak16 / 1e9:.0f} GFLOP/s bf16")
    print(f"precision=auto (the default) chooses {auto.precision}: its numbers are the rlkit {auto.precision} column\n")
    print("| measurement | baseline | rlkit fp32 | rlkit bf16 | ratio fp32 | ratio bf16 |")
    print("|---|---|---|---|---|---|")
    print(f"| train step 16x256, tok/s (baseline HF+PEFT fp32) | {t['hf_peft_fp32_tok_s']:.0f} | {t['rlkit_fp32_tok_s']:.0f} | {t['rlkit_bf16_tok_s']:.0f} | {t['rlkit_fp32_tok_s'] / t['hf_peft_fp32_tok_s']:.2f}x | {t['rlkit_bf16_tok_s'] / t['hf_peft_fp32_tok_s']:.2f}x |")
    print(f"| train step, fraction of matmul peak | {t['hf_peft_fp32_peak_frac']:.0%} | {t['rlkit_fp32_peak_frac']:.0%} | {t['rlkit_bf16_peak_frac']:.0%} | | |")
    print(f"| group sampling 8x8x64, tok/s (baseline generate fp32) | {s['hf_generate_fp32_group_tok_s']:.0f} | {s['rlkit_fp32_group_tok_s']:.0f} | {s['rlkit_bf16_group_tok_s']:.0f} | {s['rlkit_fp32_group_tok_s'] / s['hf_generate_fp32_group_tok_s']:.2f}x | {s['rlkit_bf16_group_tok_s'] / s['hf_generate_fp32_group_tok_s']:.2f}x |")
    print(f"| group sampling vs generate with bf16 weights | {s['hf_generate_bf16_group_tok_s']:.0f} | | {s['rlkit_bf16_group_tok_s']:.0f} | | {s['rlkit_bf16_group_tok_s'] / s['hf_generate_bf16_group_tok_s']:.2f}x |")
    print(f"| batch-1 greedy decode, tok/s (baseline generate fp32) | {s['hf_generate_fp32_batch1_tok_s']:.0f} | {s['rlkit_fp32_batch1_tok_s']:.0f} | {s['rlkit_bf16_batch1_tok_s']:.0f} | {s['rlkit_fp32_batch1_tok_s'] / s['hf_generate_fp32_batch1_tok_s']:.2f}x | {s['rlkit_bf16_batch1_tok_s'] / s['hf_generate_fp32_batch1_tok_s']:.2f}x |")
    print(f"| peak RSS of a 16x256 LoRA step, GiB (baseline HF+PEFT fp32) | {m['hf']:.1f} | {m['rlkit-fp32']:.1f} | {m['rlkit-bf16']:.1f} | {m['rlkit-fp32'] / m['hf']:.2f}x | {m['rlkit-bf16'] / m['hf']:.2f}x |")
    print(f"| sampler-vs-trainer mean abs logprob diff | | {results['mismatch']['fp32']:.2e} | {results['mismatch']['bf16']:.2e} | | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
