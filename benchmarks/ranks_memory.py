"""Memory per rank of the local engine on SmolLM2-135M, 1 rank vs N under torchrun (issue 42
item 6). Each rank opens the service, a session (LoRA rank 16, or full fine-tuning with
``--full``), runs two forward_backward + optim_step calls on a fixed batch, then samples once from
the trained weights (``save_weights_and_get_sampling_client``). It prints, as one JSON line per
rank: the bytes of tensor storage it holds (:func:`rlkit.backends.local.rank_memory.held_tensor_bytes`:
every parameter, buffer and optimizer state, counted by storage, not RSS) and its resident memory
now (``VmRSS``), both after training and after the sample, the decoder-layer weights it holds, and
its peak resident memory (``ru_maxrss``, which includes loading the whole base once on every rank).

    python benchmarks/ranks_memory.py [--full]                                     # one process
    torchrun --standalone --nproc-per-node 2 benchmarks/ranks_memory.py [--full]  # 2 ranks
    python benchmarks/ranks_memory.py --compare [--nproc 2]  # all four (LoRA/full x 1/N ranks), one table
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MiB = 2**20


def rss_now() -> float:
    """Resident memory now, MiB (``VmRSS``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(full: bool) -> None:
    import torch

    import rlkit
    from rlkit.backends.local.distributed import local
    from rlkit.backends.local.rank_memory import held_tensor_bytes
    from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams

    service = rlkit.connect("local", precision="fp32", activation_checkpointing=False, num_threads=1)
    if full:
        trainer = service.create_full_training_client("smollm2-135m-instruct", seed=0)
    else:
        trainer = service.create_lora_training_client("smollm2-135m-instruct", rank=16, seed=0)
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(8):
        tokens = torch.randint(10, 40000, (128,), generator=g).tolist()
        data.append(Datum(model_input=ModelInput.from_ints(tokens),
                          loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": [1.0] * 127 + [0.0]}))
    for _ in range(2):
        trainer.forward_backward(data, "cross_entropy").result()
        trainer.optim_step(AdamParams(learning_rate=1e-5)).result()
    engine = trainer._engine
    out = {"mode": "full" if full else "lora", "rank": engine.rank, "ranks": engine.world_size,
           "layers_mib": sum(local(p).numel() * p.element_size() for p in engine.decoder.layers.parameters()) / MiB,
           "held_train_mib": held_tensor_bytes()["bytes"] / MiB, "rss_train_mib": rss_now()}
    sampler = trainer.save_weights_and_get_sampling_client()
    tokens = service.get_tokenizer("smollm2-135m-instruct").encode("The capital of France is")
    sampler.sample(ModelInput.from_ints(tokens), num_samples=2, sampling_params=SamplingParams(max_tokens=8, temperature=0.0, seed=0)).result()
    out.update(held_sample_mib=held_tensor_bytes()["bytes"] / MiB, rss_sample_mib=rss_now(),
               peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print("RANKS_MEMORY " + json.dumps(out), flush=True)
    del sampler
    trainer.stop()
    service.close()


def compare(nproc: int) -> None:
    """Run the four cases one after another and print one table (a row per rank)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows = []
    for full in (False, True):
        for ranks in (1, nproc):
            launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                         "--nproc-per-node", str(ranks)]
            cmd = launch + [os.path.abspath(__file__)] + (["--full"] if full else [])
            start = time.time()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"ranks_memory: {' '.join(cmd[1:])} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            found = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("RANKS_MEMORY ")]
            rows += sorted(found, key=lambda r: r["rank"])
            print(f"# {'full' if full else 'lora'} on {ranks} rank(s): {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    head = ("mode", "ranks", "rank", "layer weights", "tensors after train", "RSS after train",
            "tensors after sample", "RSS after sample", "peak RSS")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["mode"], r["ranks"], r["rank"]] + [f"{r[k]:.0f} MiB" for k in (
            "layers_mib", "held_train_mib", "rss_train_mib", "held_sample_mib", "rss_sample_mib", "peak_rss_mib")]
        print("| " + " | ".join(map(str, cells)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="full fine-tuning (default: LoRA rank 16)")
    parser.add_argument("--compare", action="store_true", help="run LoRA and full on 1 and --nproc ranks; print one table")
    parser.add_argument("--nproc", type=int, default=2, help="ranks of --compare's sharded runs (default 2)")
    args = parser.parse_args()
    if args.compare:
        compare(args.nproc)
    else:
        worker(args.full)


if __name__ == "__main__":
    main()
