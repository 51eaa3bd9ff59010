"""Run by tests/backends/test_local_ranks_checkpointing.py under ``torchrun --nproc-per-node 2``:
two LoRA steps on the tiny model with activation checkpointing off, on every layer, and on rank 0
only (``auto`` may choose differently per rank: each rank's share differs). Rank 0 writes, per
mode, each step's loss and grad norm, the layers checkpointed, and how many times a decoder layer's
forward ran (a checkpointed layer runs again in backward) as JSON to ``argv[1]``."""

import json
import sys
from pathlib import Path

import torch.distributed as dist
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

sys.path.insert(0, str(Path(__file__).parent))

import rlkit  # noqa: E402
from ranks_worker import batch  # noqa: E402
from rlkit.types import AdamParams  # noqa: E402

calls = {"n": 0}
original = LlamaDecoderLayer.forward


def counted(self, *args, **kwargs):
    calls["n"] += 1
    return original(self, *args, **kwargs)


LlamaDecoderLayer.forward = counted


def main(out: Path) -> None:
    results = {}
    for mode in ("off", "all", "rank0"):
        service = rlkit.connect("local", precision="fp32", num_threads=1, activation_checkpointing=mode != "off")
        trainer = service.create_lora_training_client("tiny", rank=4, seed=0)
        engine = trainer._engine
        if mode == "rank0":
            engine.checkpoint_layers = lambda tokens, e=engine: e.n_layers if e.rank == 0 else 0
        steps = []
        for _ in range(2):
            calls["n"] = 0
            fb = trainer.forward_backward(batch(), "cross_entropy").result()
            opt = trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
            steps.append({"loss": fb.metrics["loss:sum"], "grad_norm": opt.metrics["grad_norm"],
                          "layers": list(engine.checkpointed_layers), "forwards": calls["n"]})
        results[mode] = steps
        trainer.stop()
        service.close()
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
