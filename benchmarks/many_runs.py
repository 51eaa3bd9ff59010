"""Many runs, one pass (issue 43): the issue's judge benchmark (default), and two measurements of
the numerical core (``--core``, ``--sampling``).

**The judge** (issue 43, "How we will judge it"; :mod:`many_runs_judge`), in one run:

A. 1, 2, 4 and 8 (``--clients``) concurrent GRPO clients through the real ``tinker`` SDK against
   ``rlkit serve tinker`` (``--model``, SmolLM2-135M by default), each N against two servers started
   fresh: the new code (fused passes and mixed decode batches) and today's (``--no-fuse-runs``: each
   run's passes its own, the sampler one adapter at a time). Each client: one warm-up step, then
   ``--steps`` steps of ``--prompts`` prompts x ``--group`` samples x ``--max-tokens`` tokens
   (temperature 1, a seed per request), importance_sampling forward_backward, optim_step. Printed per
   N and arm: aggregate sampling and training tokens/s, median per-run step time, new/today; 4 runs
   (new) against 1 run (today) beside the goals (sampling >= 3x, training >= 1.3x); every client's
   per-step loss with fusion vs without at the same N, and client 0's across N (rel 1e-4): PASS/FAIL.
B. ``rlkit repro`` with ``--repro-seeds`` seeds (3) of ``--repro-recipe``, separate processes vs
   ``jobs=shared``: wall times, their ratio beside the goal (<= 0.6x), each run's ``metrics.jsonl``
   equal between the two (``--skip-repro`` skips it). The default is the main job
   (``arithmetic_grpo``) shortened to 3 steps with 20 evaluation problems
   (:data:`many_runs_judge.SHORT_MAIN`), so the whole run takes about 10 minutes on 2 cores;
   ``--repro-overrides`` with nothing after it runs the recipe as it is: for ``arithmetic_grpo``
   the main job's full measurement (30 steps, RL and SFT arms: most of an hour separate).

    python benchmarks/many_runs.py                                      # the judge, SmolLM2-135M
    python benchmarks/many_runs.py --model tiny --clients 1 2 --steps 1 \
        --repro-recipe arithmetic_grpo_smoke --repro-seeds 2            # smoke (~2 min)

The machine's matmul peak and load average are printed with it: CPU numbers mean something only on
a quiet machine (load average below 2).

**``--core``**: N LoRA runs over one frozen base, forward+backward in one fused pass (unmerged
per-row LoRA, :mod:`rlkit.backends.local.multi_lora`) vs one pass per run (each run's own engine,
today's code).

    python benchmarks/many_runs.py --core                       # SmolLM2-135M, 1/2/4 runs, CPU
    python benchmarks/many_runs.py --core --model tiny --repeats 1 --rows 2 --seq 32   # smoke (seconds)
    python benchmarks/many_runs.py --core --device cuda --precision bf16 --runs 1 2 4 8
    python benchmarks/many_runs.py --core --core-group 4 --rows 8 --seq 56 --prompt-len 40   # the judge's GRPO shape

Each run trains its own adapter (rank/alpha of ``--rank``, its own seed) on its own rows of real
GSM8K conversations (``--rows`` x ``--seq`` tokens a run, no padding); with ``--core-group G``
GRPO-shaped: groups of G rows sharing their first ``--prompt-len`` tokens, which each engine alone
and the fused pass both compute once a group. Printed per N: forward+backward
tokens/s of N separate passes and of one fused pass, their ratio, the fraction of this machine's
matmul peak each reaches (measured in this run: 4 x matmul parameters per token, as
``session_throughput.py`` counts), and the largest per-token logprob difference between the two
(the fused numbers must be each run's own). Median of ``--repeats`` after one warm-up.

``--sampling``: the sampler side instead. ``--adapters`` LoRA adapters (rank ``--rank``, random,
non-zero) each sample ``--samples`` completions of one prompt (``--max-tokens`` tokens, greedy, so
the tokens can be compared): all adapters' requests in ONE decode batch (per-row, unmerged LoRA:
:mod:`rlkit.backends.local.row_lora`) vs one adapter at a time (each merged into the sampling copy,
today's way, the merge included), decode tokens/s side by side and their ratio; then one adapter
alone, merged vs per-row (why a single-adapter batch merges), and whether every adapter's tokens
equal its solo ones.

    python benchmarks/many_runs.py --sampling                       # SmolLM2-135M, 4 adapters
    python benchmarks/many_runs.py --sampling --model tiny          # smoke

CPU numbers are meaningful only on a quiet machine (load average below 2): every mode prints the
load average beside them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import session_throughput as st  # noqa: E402  (matmul_peak, flops_per_token, sft_batch: written once, there)


def build(args, n_runs: int):
    """``n_runs`` engines over one base, their data, and the fused model with every adapter attached."""
    import torch

    from rlkit.backends.local.engine import LoraSpec, TrainingEngine
    from rlkit.backends.local.models import load_model, share_base
    from rlkit.backends.local.multi_lora import MultiLoraModel

    loaded = load_model(args.model, device=args.device if args.device != "cpu" else None)
    st.ROWS, st.SEQ = n_runs * args.rows, args.seq
    seqs = st.sft_batch(loaded.tokenizer)
    if len(seqs) < n_runs * args.rows:
        raise SystemExit(f"only {len(seqs)} GSM8K conversations for {n_runs} x {args.rows} rows")
    if args.core_group > 1:  # GRPO-shaped: groups of core_group rows sharing a prompt of prompt_len tokens
        p = args.prompt_len
        seqs = [seqs[(k // args.core_group) * args.core_group][:p] + s[p:] for k, s in enumerate(seqs)]
    data = [st.rlkit_datums(seqs[k * args.rows : (k + 1) * args.rows]) for k in range(n_runs)]
    engines = []
    for k in range(n_runs):
        engine = TrainingEngine(share_base(loaded.model), LoraSpec(rank=args.rank, alpha=2 * args.rank, seed=k),
                                precision=args.precision, device=torch.device(args.device),
                                micro_batch_tokens=args.rows * args.seq, activation_checkpointing=False)
        with torch.no_grad():  # non-zero B: the adapters change the numbers, as after a few steps
            gen = torch.Generator().manual_seed(100 + k)
            for _a, b, _s in engine.lora_modules().values():
                b.copy_((torch.randn(b.shape, generator=gen) * 0.01).to(b.device))
        engines.append(engine)
    fused = MultiLoraModel(loaded.model, precision=args.precision)
    for k, engine in enumerate(engines):
        fused.attach(f"run{k}", engine)
    return loaded.model, engines, data, fused


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        st.sync()
        t0 = time.perf_counter()
        fn()
        st.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(args, n_runs: int, peak: float) -> dict:
    from rlkit.backends.local.multi_lora import RunWork, fused_run
    from rlkit.losses.registry import build_loss

    model, engines, data, fused = build(args, n_runs)
    loss = build_loss("cross_entropy")
    tokens = n_runs * args.rows * args.seq

    def separate():
        outs = [engine.run(d, loss, backward=True) for engine, d in zip(engines, data)]
        for engine in engines:
            engine.optimizer.zero_grad(set_to_none=True)
        return outs

    works = [RunWork(f"run{k}", d, loss) for k, d in enumerate(data)]

    def together():
        outs = fused_run(fused, works, backward=True, micro_batch_tokens=tokens)
        for engine in engines:
            engine.optimizer.zero_grad(set_to_none=True)
        return outs

    t_sep, t_fused = timed(separate, args.repeats), timed(together, args.repeats)
    diff = 0.0
    for a, b in zip(separate(), together()):
        for x, y in zip(a.loss_fn_outputs, b.loss_fn_outputs):
            diff = max(diff, float((x["logprobs"].to_torch() - y["logprobs"].to_torch()).abs().max()))
    fpt = st.flops_per_token(model)
    return {"runs": n_runs, "tokens": tokens, "separate_tok_s": tokens / t_sep, "fused_tok_s": tokens / t_fused,
            "speedup": t_sep / t_fused, "separate_peak": tokens * fpt / t_sep / peak,
            "fused_peak": tokens * fpt / t_fused / peak, "max_logprob_diff": diff}


def sampling(args) -> None:
    """The ``--sampling`` mode (see the module docstring)."""
    import torch

    from rlkit.backends.local import sampler as sampler_mod
    from rlkit.backends.local.models import load_model
    from rlkit.backends.local.sampler import SampleRequest, Sampler
    from rlkit.types import SamplingParams

    loaded = load_model(args.model, device=args.device if args.device != "cpu" else None)
    s = Sampler(loaded.model, loaded.tokenizer, [], precision=args.precision)
    gen = torch.Generator().manual_seed(0)
    adapters = {}
    for k in range(args.adapters):
        adapter = {}
        for path, m in s.model.named_modules():
            if isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
                adapter[path] = (torch.randn(args.rank, m.in_features, generator=gen) / m.in_features ** 0.5,
                                 torch.randn(m.out_features, args.rank, generator=gen) * 0.05, 2.0)
        adapters[f"run{k}"] = adapter
    prompt = loaded.tokenizer.encode("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                                     "clips in May. How many clips did Natalia sell altogether in April and May? Answer:")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    def requests(keys):
        return [SampleRequest(prompt, args.samples, params, stop_token_ids=[]).for_weights(k, adapters[k]) for k in keys]

    def run(batches):
        s.set_weights("", None)  # every measurement starts from the base (a merge is part of the cost)
        st.sync()
        t0 = time.perf_counter()
        outs = [r for keys in batches for r in s.sample(requests(keys))]
        st.sync()
        return time.perf_counter() - t0, outs

    keys = list(adapters)
    tokens = len(keys) * args.samples * args.max_tokens
    run([keys])  # warm-up
    t_one, solo = min((run([[k] for k in keys]) for _ in range(args.repeats)), key=lambda r: r[0])
    t_all, together = min((run([keys]) for _ in range(args.repeats)), key=lambda r: r[0])
    same = all([q.tokens for q in a.sequences] == [q.tokens for q in b.sequences] for a, b in zip(solo, together))
    one = args.samples * args.max_tokens
    t_merged, _ = min((run([keys[:1]]) for _ in range(args.repeats)), key=lambda r: r[0])
    sampler_mod.MERGE_SINGLE = False
    try:
        t_rows, _ = min((run([keys[:1]]) for _ in range(args.repeats)), key=lambda r: r[0])
    finally:
        sampler_mod.MERGE_SINGLE = True
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"model {args.model} {args.precision} on {args.device}, {torch.get_num_threads()} threads; {len(keys)} adapters of rank "
          f"{args.rank}, {args.samples} samples x {args.max_tokens} tokens each, greedy; best of {args.repeats}; load average {load:.1f}")
    print("| adapters | one adapter at a time (merged), tok/s | one batch (per-row), tok/s | batch / one at a time | tokens equal solo |")
    print("|---|---|---|---|---|")
    print(f"| {len(keys)} | {tokens / t_one:.1f} | {tokens / t_all:.1f} | {t_one / t_all:.2f}x | {same} |")
    print(f"one adapter alone: merged {one / t_merged:.1f} tok/s, per-row {one / t_rows:.1f} tok/s "
          f"(merged / per-row {t_rows / t_merged:.2f}x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=st.MODEL)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rows", type=int, default=4, help="rows per run")
    parser.add_argument("--seq", type=int, default=128, help="tokens per row")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--core-group", type=int, default=1,
                        help="--core: a run's rows in groups of this many sharing their first --prompt-len tokens (GRPO-shaped)")
    parser.add_argument("--prompt-len", type=int, default=40, help="--core: the shared prompt's tokens when --core-group > 1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sampling", action="store_true", help="measure the sampler: several adapters in one decode")
    parser.add_argument("--adapters", type=int, default=4, help="--sampling: adapters sampled concurrently")
    parser.add_argument("--samples", type=int, default=4, help="--sampling: samples per adapter")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per sample (judge: 16; --sampling: 32)")
    parser.add_argument("--core", action="store_true", help="measure the fused forward+backward core, not the judge")
    parser.add_argument("--judge", action="store_true", help="the judge benchmark (the default)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8], help="judge: concurrent SDK clients")
    parser.add_argument("--steps", type=int, default=2, help="judge: GRPO steps a client, after one warm-up")
    parser.add_argument("--prompts", type=int, default=2, help="judge: prompts a client and step")
    parser.add_argument("--group", type=int, default=4, help="judge: samples a prompt")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="judge: the server's torch threads")
    parser.add_argument("--skip-repro", action="store_true", help="judge: no rlkit repro part")
    parser.add_argument("--skip-ceilings", action="store_true",
                        help="judge: no ceilings line (what fusion can gain at most here, many_runs_ceiling)")
    parser.add_argument("--repro-recipe", default="arithmetic_grpo", help="judge: the recipe rlkit repro runs")
    parser.add_argument("--repro-seeds", type=int, default=3)
    parser.add_argument("--repro-overrides", nargs="*", default=None,
                        help="judge: overrides for rlkit repro (default: arithmetic_grpo shortened, see above)")
    args = parser.parse_args()
    import torch

    st.DEVICE = args.device
    if args.sampling:
        args.max_tokens = args.max_tokens or 32
        sampling(args)
        return

    peak = st.matmul_peak("bfloat16" if args.precision == "bf16" else "float32")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    machine = (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} "
               f"threads, device {args.device}; matmul peak {peak / 1e9:.0f} GFLOP/s ({args.precision}); load average {load:.1f} at start")
    if not args.core:
        import many_runs_judge

        args.max_tokens = args.max_tokens or 16
        print(machine, flush=True)
        many_runs_judge.judge(args)
        load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"load average {load_end:.1f} at the end (numbers are meaningful on a quiet machine only)")
        return
    shape = f"; groups of {args.core_group} sharing a {args.prompt_len}-token prompt" if args.core_group > 1 else ""
    print(f"{machine}; model {args.model} {args.precision}; {args.rows} x {args.seq} tokens a run{shape}, LoRA rank {args.rank}")
    print("| runs | one pass per run, tok/s | one fused pass, tok/s | fused / separate | matmul peak, separate | fused | max dlogprob |")
    print("|---|---|---|---|---|---|---|")
    for n in args.runs:
        r = measure(args, n, peak)
        print(f"| {r['runs']} | {r['separate_tok_s']:.0f} | {r['fused_tok_s']:.0f} | {r['speedup']:.2f}x | "
              f"{r['separate_peak']:.1%} | {r['fused_peak']:.1%} | {r['max_logprob_diff']:.1e} |", flush=True)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load_end:.1f} at the end (numbers are meaningful on a quiet machine only)")


if __name__ == "__main__":
    main()
