"""What the SageMaker wire protocol costs per operation: the same calls on rlkit's local backend
(in-process), through the real ``sagemaker-train`` SDK to ``rlkit emulate sagemaker`` (a separate
process on this machine, same engine), and through rlkit's SageMaker adapter on top of that SDK.

    python benchmarks/sagemaker_overhead.py                       # strict emulator, the SDK's own 2 s polls
    python benchmarks/sagemaker_overhead.py --cadence fast         # strict answers, long-polled results
    python benchmarks/sagemaker_overhead.py --emulator permissive  # the old answers (logprobs returned)
    python benchmarks/sagemaker_overhead.py --model smollm2-135m-instruct --reps 10
    python benchmarks/sagemaker_overhead.py --loops                 # RL and SFT steps, before/after (see sagemaker_loop_steps.py)
    python benchmarks/sagemaker_overhead.py --loops --cadence fast
    python benchmarks/sagemaker_overhead.py --breakdown             # the smoke recipe end to end: where each step's time goes

``--loops`` runs an RL smoke step and an SFT step through ``rlkit train ... backend=sagemaker``
instead of single operations, and prints the round trips and seconds of each step with the trainer's
logprobs always scored (the old behaviour, ``backend.always_score_logprobs=true``) and scored only on
need (the default): :mod:`sagemaker_loop_steps`.

``--breakdown`` runs the smoke recipe as a user does (evaluation included) and prints, per line of
``metrics.jsonl``, its seconds, the loop's own split (``time/*``), the service operations waited on
(count x mean seconds) and how many *serial* waits they made: on the SDK's cadence each serial wait
costs at least one 2 s poll, so that column times 2 s is the floor the cadence puts under a step.

``--emulator strict`` (the default) answers as the SDK documents the service: no per-token logprobs,
so the adapter's ``forward``/``forward_backward`` also score them with ``compute_logprobs`` (after an
``optim_step``, on a ``saveWeights`` of their own) — that cost is part of its rows.
``--cadence sdk`` (the default) leaves the SDK's polling as against the service (a result is
checked at once, then every 2 s; creation every 10 s), so each row includes those waits;
``--cadence fast`` long-polls, which isolates the wire and the adapter.

Each operation is submitted and waited for, one at a time (no pipelining), ``--reps`` times after
one warm-up round, interleaving the three paths so a busy machine slows them alike; the table
shows medians in milliseconds and the ratio to the local call. The emulator's engine and the local
backend run with the same number of torch threads (1 by default). ``sample@8``
asks for 8 new tokens: the local backend decodes 8, while SageMaker requires ``max_tokens >= 512``,
so the adapter asks for 512 and keeps 8 — that row is the price of the service's floor, not of the
wire. ``sample@512`` compares like with like. Every number is measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def start_emulator(threads: int, mode: str, cadence: str):
    cmd = [sys.executable, "-m", "rlkit", "emulate", "sagemaker", "--port", "0", "--num-threads", str(threads), "--cadence", cadence]
    if mode == "permissive":
        cmd.append("--permissive")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"the emulator did not start: {line}")
    return proc, line.strip().rsplit(" ", 1)[-1]


def operations(trainer, sampler, batch, prompt, adam):
    """name -> zero-argument call that submits one operation and waits for it."""
    return {
        "forward_backward": lambda: trainer.forward_backward(batch).result(),
        "optim_step": lambda: trainer.optim_step(adam).result(),
        "forward_backward+optim_step (pipelined)": lambda: [f.result() for f in (trainer.forward_backward(batch), trainer.optim_step(adam))],
        "save_weights_for_sampler": lambda: trainer.save_weights_for_sampler().result(),
        "compute_logprobs": lambda: sampler.compute_logprobs(prompt).result(),
        "sample@8 (4 samples)": lambda: sampler.sample(prompt, 4, {"max_tokens": 8, "temperature": 1.0, "seed": 1}).result(),
        "sample@512 (4 samples)": lambda: sampler.sample(prompt, 4, {"max_tokens": 512, "temperature": 1.0, "seed": 1}).result(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    ap.add_argument("--emulator", choices=["strict", "permissive"], default="strict", help="the emulator's answers")
    ap.add_argument("--cadence", choices=["sdk", "fast"], default="sdk", help="sdk: the SDK's own polling; fast: long-polls")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--loops", action="store_true", help="RL and SFT steps, before/after opt-in scoring, instead of operations")
    ap.add_argument("--steps", type=int, default=3, help="--loops: training steps per run")
    ap.add_argument("--out", default="", help="--loops/--breakdown: also write the per-step numbers here (JSON)")
    ap.add_argument("--breakdown", action="store_true",
                    help="run `rlkit train recipe=arithmetic_grpo_smoke backend=sagemaker` end to end and print where each step's time goes")
    ap.add_argument("overrides", nargs="*", help="--breakdown: more overrides for the run (e.g. train.concurrency=8)")
    args = ap.parse_args()
    if args.loops or args.breakdown:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import sagemaker_loop_steps

        proc, url = start_emulator(args.threads, args.emulator, args.cadence)
        os.environ.update({
            "SAGEMAKER_TRAINING_SESSION_ENDPOINT": url, "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": url,
            "AWS_REGION": "us-west-2", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
        })
        try:
            if args.breakdown:
                os.environ.setdefault("RLKIT_QUIET", "1")
                result = sagemaker_loop_steps.breakdown(url, sagemaker_loop_steps.SMOKE + args.overrides)
                sagemaker_loop_steps.print_breakdown(result, args.cadence)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump({"cadence": args.cadence, **result}, f, indent=2)
            else:
                sagemaker_loop_steps.main(url, args.cadence, args.steps, args.out)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        return

    import torch

    torch.set_num_threads(args.threads)
    import rlkit
    from rlkit.chat import conversation_datum

    proc, url = start_emulator(args.threads, args.emulator, args.cadence)
    os.environ.update({
        "SAGEMAKER_TRAINING_SESSION_ENDPOINT": url, "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": url,
        "AWS_REGION": "us-west-2", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
    })
    results = {}
    try:
        local = rlkit.connect("local", num_threads=args.threads)
        sm = rlkit.connect("sagemaker", billing_metrics=False)
        tok = local.get_tokenizer(args.model)
        conv = [{"role": "user", "content": "What is 17 + 25?"}, {"role": "assistant", "content": "17 + 25 = 42."}]
        batch = [conversation_datum(tok, conv) for _ in range(8)]
        prompt = tok.encode("Say something about the number 7.")
        adam = rlkit.AdamParams(learning_rate=1e-4)

        lt = local.create_lora_training_client(args.model, rank=8, alpha=16)
        ls = lt.save_weights_and_get_sampling_client()
        st = sm.create_lora_training_client(args.model, rank=8, alpha=16)
        ss = st.save_weights_and_get_sampling_client()

        # the SDK alone (no rlkit adapter), on the adapter's session: its own calls and futures
        from rlkit.backends.sagemaker import convert

        sdk_tc, sdk_sc = st._sdk, ss._sdk
        wire = [convert.datum_to_wire(d) for d in batch]
        wire_prompt = convert.tokens_to_wire(prompt)
        adam_wire = {"learning_rate": 1e-4}
        sdk_ops = {
            "forward_backward": lambda: sdk_tc.forward_backward(wire, "cross_entropy").result(),
            "optim_step": lambda: sdk_tc.optim_step(adam_wire).result(),
            "forward_backward+optim_step (pipelined)": lambda: [f.result() for f in (sdk_tc.forward_backward(wire, "cross_entropy"), sdk_tc.optim_step(adam_wire))],
            "save_weights_for_sampler": lambda: sdk_tc.save_weights_for_sampler().result(),
            "compute_logprobs": lambda: sdk_sc.compute_logprobs(wire_prompt).result(),
            "sample@512 (4 samples)": lambda: sdk_sc.sample(wire_prompt, 4, {"max_tokens": 512, "temperature": 1.0, "seed": 1}).result(),
        }
        paths = {
            "local": operations(lt, ls, batch, prompt, adam),
            "SDK -> emulator": sdk_ops,
            "rlkit adapter -> SDK -> emulator": operations(st, ss, batch, prompt, adam),
        }
        # interleaved (local, SDK, adapter, local, ...) so a busy machine slows every path alike
        samples = {path: {op: [] for op in ops} for path, ops in paths.items()}
        for op in paths["local"]:
            for rep in range(args.reps + 1):
                for path, ops in paths.items():
                    if op in ops:
                        t0 = time.perf_counter()
                        ops[op]()
                        if rep:  # the first round warms up
                            samples[path][op].append((time.perf_counter() - t0) * 1000)
        results = {path: {op: statistics.median(v) for op, v in ops.items()} for path, ops in samples.items()}
        lt.stop()
        st.stop()
        sm.close()
        local.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    if args.json:
        print(json.dumps({"emulator": args.emulator, "cadence": args.cadence, "results": results}, indent=2))
        return
    base = results["local"]
    cols = ["SDK -> emulator", "rlkit adapter -> SDK -> emulator"]
    print(f"model {args.model}, {args.threads} torch threads, {args.emulator} emulator on the {args.cadence} cadence, "
          f"median of {args.reps} (ms; ratio to local)\n")
    print("| operation | local | " + " | ".join(cols) + " | wire + SDK overhead |")
    print("|---|---:|" + "---:|" * len(cols) + "---:|")
    for op, t_local in base.items():
        cells = []
        for c in cols:
            t = results[c].get(op)
            cells.append("-" if t is None else f"{t:.1f} ({t / t_local:.2f}x)")
        adapter = results[cols[1]][op]
        print(f"| {op} | {t_local:.1f} | " + " | ".join(cells) + f" | {adapter - t_local:+.1f} ms |")


if __name__ == "__main__":
    main()
