"""Run by tests/backends/test_local_ranks.py, alone or under ``torchrun --nproc-per-node N``: the
same loop code either way (SPMD). A LoRA and a full fine-tuning session each take a few
forward_backward + optim_step steps on the tiny model; rank 0 (or the one process) writes every
step's loss, grad norm and logprobs as JSON to ``argv[1]``."""

import json
import sys

import torch

import rlkit
from rlkit.backends.local.distributed import is_writer
from rlkit.types import AdamParams, Datum, ModelInput


def datum(tokens, prompt_len):
    n = len(tokens)
    weights = [0.0 if i < prompt_len - 1 else 1.0 for i in range(n)]
    weights[-1] = 0.0
    return Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": weights})


def batch():
    g = torch.Generator().manual_seed(0)
    rows = []
    for length in (9, 23, 14, 31, 6, 17, 12):  # uneven, so the ranks' shares differ
        rows.append(datum(torch.randint(3, 500, (length,), generator=g).tolist(), prompt_len=3))
    return rows


def run(trainer, steps=3):
    from rlkit.backends.local.distributed import is_sharded, share

    engine = trainer._engine
    out = []
    data = batch()
    layer = next(engine.decoder.layers[0].parameters())
    ranks = engine.world_size
    out.append({"sharded": is_sharded(layer), "shares": [len(s) for s in share(data, ranks, engine.group_shared_prefix)]})
    for _ in range(steps):
        fb = trainer.forward_backward(data, "cross_entropy").result()
        opt = trainer.optim_step(AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
        out.append({"loss": fb.metrics["loss:sum"], "tokens": fb.metrics["tokens:weighted"], "grad_norm": opt.metrics["grad_norm"],
                    "logprobs": [o["logprobs"].to_torch().tolist() for o in fb.loss_fn_outputs]})
    return out


def main(path):
    service = rlkit.connect("local", precision="fp32", num_threads=1, activation_checkpointing=False)
    result = {}
    lora = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    result["lora"] = run(lora)
    lora.stop()
    full = service.create_full_training_client("tiny", seed=0)
    result["full"] = run(full)
    full.stop()
    service.close()
    if is_writer():
        with open(path, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1])
