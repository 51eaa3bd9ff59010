"""Memory of ``rlkit serve tinker`` with 1 and N users' LoRA runs on one base model.

    python benchmarks/server_memory.py                                    # SmolLM2-135M, 1 and 4 runs
    python benchmarks/server_memory.py --model tiny --runs 1 4 --rlkit-path /tmp/old-rlkit

For each run count a fresh server process is started; through the real ``tinker`` SDK each run
creates a LoRA training client, does one ``forward_backward`` + ``optim_step`` (so its gradients and
AdamW state exist) and samples from its own weights once (so the sampler has merged an adapter).
The server's resident memory (``VmRSS``) and its peak (``VmHWM``) are then read from
``/proc/<pid>/status``. ``--rlkit-path`` runs the server from another checkout (e.g. an older
commit unpacked with ``git archive``) for a before/after comparison in the same run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

PROMPT = "What is 17 + 25?"


def start_server(model: str, rlkit_path: str | None, log: str | None = None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TINKER_TELEMETRY="0")
    if rlkit_path:
        env["PYTHONPATH"] = rlkit_path + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "rlkit", "serve", "tinker", "--port", "0", "--num-threads", "1", "--precision", "fp32"]
    err = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                            cwd=rlkit_path or None)  # the working directory comes first on sys.path
    for line in proc.stdout:  # type: ignore[union-attr]
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("the Tinker server did not start")


def memory_gib(pid: int) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 2**20  # kB -> GiB
    return fields


def measure(model: str, runs: int, rlkit_path: str | None) -> dict:
    import tinker
    from tinker import types

    proc, url = start_server(model, rlkit_path, os.environ.get("SERVER_LOG"))
    try:
        sdk = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        idle = memory_gib(proc.pid)
        trainers = [sdk.create_lora_training_client(base_model=model, rank=16, seed=i).result() for i in range(runs)]
        tokenizer = trainers[0].get_tokenizer()
        ids = tokenizer.encode(PROMPT)
        datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
        for trainer in trainers:
            trainer.forward_backward([datum], "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=1e-4)).result()
            sampler = trainer.save_weights_and_get_sampling_client().result()
            sampler.sample(types.ModelInput.from_ints(ids), 2, types.SamplingParams(max_tokens=8, temperature=1.0, seed=0)).result()
        time.sleep(0.5)
        return {"runs": runs, "idle": idle["VmRSS"], **memory_gib(proc.pid)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--runs", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rlkit-path", default=None, help="run the server from this checkout instead")
    args = ap.parse_args()
    where = args.rlkit_path or "this checkout"
    print(f"rlkit serve tinker, {args.model}, fp32, server from {where}")
    print("| runs | RSS idle (GiB) | RSS after every run trained + sampled (GiB) | peak RSS (GiB) |")
    print("|---|---|---|---|")
    for n in args.runs:
        r = measure(args.model, n, args.rlkit_path)
        print(f"| {n} | {r['idle']:.2f} | {r['VmRSS']:.2f} | {r['VmHWM']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
