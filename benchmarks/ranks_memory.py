"""Peak memory per rank of the local engine on SmolLM2-135M, 1 rank vs N under torchrun (issue 42
item 6). Each rank opens the service, a session (LoRA, or full fine-tuning with ``--full``), runs
two forward_backward + optim_step calls on a fixed batch and prints its peak resident memory
(``ru_maxrss``) and the bytes of the trainable/sharded parameters it holds.

    python benchmarks/ranks_memory.py [--full]
    torchrun --standalone --nproc-per-node 2 benchmarks/ranks_memory.py [--full]
"""

import argparse
import resource

import torch

import rlkit
from rlkit.backends.local.distributed import local
from rlkit.types import AdamParams, Datum, ModelInput


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="full fine-tuning (default: LoRA rank 16)")
    args = parser.parse_args()
    service = rlkit.connect("local", precision="fp32", activation_checkpointing=False, num_threads=1)
    if args.full:
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
    layer_bytes = sum(local(p).numel() * p.element_size() for p in engine.decoder.layers.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rank {engine.rank}/{engine.world_size} {'full' if args.full else 'lora'}: peak RSS {peak:.0f} MiB, "
          f"decoder-layer weights held {layer_bytes / 2**20:.0f} MiB", flush=True)
    trainer.stop()
    service.close()


if __name__ == "__main__":
    main()
