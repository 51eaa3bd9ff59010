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

On GPUs (``--device cuda``: each rank its own GPU, NCCL; ``benchmarks/gpu_check.sh --nproc N`` runs
it) each row also gives the GPU memory the rank's tensors hold after training and its peak
(``torch.cuda.max_memory_allocated``), and the median seconds of a training step (forward_backward +
optim_step) — on N ranks each rank runs 1/N of the batch. ``--model`` takes a name or a
``from_pretrained`` directory (gpu_check.sh's random-weight Qwen2.5-1.5B shape).
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


def worker(full: bool, model: str, device: str, precision: str) -> None:
    import statistics

    import torch

    import rlkit
    from rlkit.backends.local.distributed import local
    from rlkit.backends.local.rank_memory import held_tensor_bytes
    from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams

    cuda = device.startswith("cuda")
    service = rlkit.connect("local", precision=precision, activation_checkpointing=False, num_threads=None if cuda else 1,
                            device=None if cuda else device)  # on GPUs each rank its own (cuda:LOCAL_RANK)
    if full:
        trainer = service.create_full_training_client(model, seed=0)
    else:
        trainer = service.create_lora_training_client(model, rank=16, seed=0)
    vocab = int(trainer._engine.vocab_size)
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(8):
        tokens = torch.randint(10, min(40000, vocab), (128,), generator=g).tolist()
        data.append(Datum(model_input=ModelInput.from_ints(tokens),
                          loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": [1.0] * 127 + [0.0]}))
    step_s = []
    for _ in range(3 if cuda else 2):
        t0 = time.perf_counter()
        trainer.forward_backward(data, "cross_entropy").result()
        trainer.optim_step(AdamParams(learning_rate=1e-5)).result()
        step_s.append(time.perf_counter() - t0)
    engine = trainer._engine
    out = {"mode": "full" if full else "lora", "rank": engine.rank, "ranks": engine.world_size,
           "layers_mib": sum(local(p).numel() * p.element_size() for p in engine.decoder.layers.parameters()) / MiB,
           "held_train_mib": held_tensor_bytes()["bytes"] / MiB, "rss_train_mib": rss_now(),
           "step_s": statistics.median(step_s[1:])}  # the first step warms up
    if cuda:
        out.update(gpu_train_mib=torch.cuda.memory_allocated() / MiB, gpu_peak_train_mib=torch.cuda.max_memory_allocated() / MiB)
    sampler = trainer.save_weights_and_get_sampling_client()
    tokens = trainer.get_tokenizer().encode("The capital of France is")
    sampler.sample(ModelInput.from_ints(tokens), num_samples=2, sampling_params=SamplingParams(max_tokens=8, temperature=0.0, seed=0)).result()
    out.update(held_sample_mib=held_tensor_bytes()["bytes"] / MiB, rss_sample_mib=rss_now(),
               peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    sys.stdout.flush()  # then the whole line in one write: the ranks share this pipe, and a print's text and
    os.write(sys.stdout.fileno(), ("RANKS_MEMORY " + json.dumps(out) + "\n").encode())  # newline may be two writes
    del sampler
    trainer.stop()
    service.close()


def compare(nproc: int, extra: list, modes: str = "lora,full") -> None:
    """Run the four cases one after another and print one table (a row per rank)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows = []
    for full in [m == "full" for m in modes.split(",")]:
        for ranks in (1, nproc):
            launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                         "--nproc-per-node", str(ranks)]
            cmd = launch + [os.path.abspath(__file__)] + (["--full"] if full else []) + extra
            start = time.time()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"ranks_memory: {' '.join(cmd[1:])} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            found = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("RANKS_MEMORY ")]
            rows += sorted(found, key=lambda r: r["rank"])
            print(f"# {'full' if full else 'lora'} on {ranks} rank(s): {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    gpu = "gpu_train_mib" in rows[0]
    head = ("mode", "ranks", "rank", "layer weights", "tensors after train", "RSS after train",
            "tensors after sample", "RSS after sample", "peak RSS") + (("GPU after train", "GPU peak") if gpu else ()) + ("step",)
    keys = ("layers_mib", "held_train_mib", "rss_train_mib", "held_sample_mib", "rss_sample_mib", "peak_rss_mib") + (
        ("gpu_train_mib", "gpu_peak_train_mib") if gpu else ())
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["mode"], r["ranks"], r["rank"]] + [f"{r[k]:.0f} MiB" for k in keys] + [f"{r['step_s']:.2f} s"]
        print("| " + " | ".join(map(str, cells)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="full fine-tuning (default: LoRA rank 16)")
    parser.add_argument("--compare", action="store_true", help="run LoRA and full on 1 and --nproc ranks; print one table")
    parser.add_argument("--nproc", type=int, default=2, help="ranks of --compare's sharded runs (default 2)")
    parser.add_argument("--modes", default="lora,full", help="--compare's modes: lora, full or lora,full (default)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a model name or a from_pretrained directory")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (each rank its own GPU)")
    parser.add_argument("--precision", default="fp32", help="fp32 (default), bf16, auto")
    args = parser.parse_args()
    if args.compare:
        bad = set(args.modes.split(",")) - {"lora", "full"}
        if bad:
            parser.error(f"--modes {args.modes}: expected lora, full or lora,full")
        compare(args.nproc, ["--model", args.model, "--device", args.device, "--precision", args.precision], args.modes)
    else:
        worker(args.full, args.model, args.device, args.precision)


if __name__ == "__main__":
    main()
