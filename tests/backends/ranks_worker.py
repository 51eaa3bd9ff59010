"""Run by tests/backends/test_local_ranks.py, alone or under ``torchrun --nproc-per-node N``: the
same loop code either way (SPMD). A LoRA and a full fine-tuning session each take a few
forward_backward + optim_step steps on the tiny model and saves its state; rank 0 (or the one
process) writes every step's loss, grad norm and logprobs as JSON to ``argv[1]``. Checkpoints go
under ``argv[2]``; with ``argv[3]`` (an earlier run's JSON) each session's checkpoint from that
run is also resumed here.

``argv[4]`` picks a leaner run for tests/backends/test_local_ranks_dcp.py: ``save`` (each session
takes one step, saves its state and exports its weights: the checkpoint, the logprobs it holds and
the step after it) or ``resume`` (each session only resumed from ``argv[3]``'s checkpoint).

Usage: ranks_worker.py OUT.json CHECKPOINT_DIR [EARLIER.json [save|resume]]"""

import json
import sys

import torch

import rlkit
from rlkit.backends.local.distributed import is_writer
from rlkit.errors import InvalidInputError
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
    prompt = torch.randint(3, 500, (20,), generator=g).tolist()  # a group: one rank, its prompt once (packed)
    for length in (5, 9, 3):
        rows.append(datum(prompt + torch.randint(3, 500, (length,), generator=g).tolist(), prompt_len=20))
    return rows


def step(trainer, data):
    fb = trainer.forward_backward(data, "cross_entropy").result()
    before = trainer.gradient_norm().result()  # between the two: sharded and not-yet-summed replicated gradients
    opt = trainer.optim_step(AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    return {"loss": fb.metrics["loss:sum"], "tokens": fb.metrics["tokens:weighted"], "grad_norm": opt.metrics["grad_norm"],
            "norm_before_step": before,
            "logprobs": [o["logprobs"].to_torch().tolist() for o in fb.loss_fn_outputs]}


def dpo_step(trainer, data):
    """A step of DPO (a loss over the whole batch: (chosen, rejected) pairs) on the first 6 rows."""
    from rlkit.losses import DPO

    pairs = [Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "ref_logprobs": [0.0] * d.model_input.length})
             for d in data[:6]]
    fb = trainer.forward_backward(pairs, DPO(beta=0.1)).result()
    opt = trainer.optim_step(AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    return {"loss": fb.metrics["loss:sum"], "tokens": fb.metrics["tokens:weighted"], "grad_norm": opt.metrics["grad_norm"],
            "logprobs": [o["logprobs"].to_torch().tolist() for o in fb.loss_fn_outputs]}


def ppo_step(trainer, data):
    """A PPO step (clipped ratio to the current logprobs, advantages +-1 by row)."""
    old = logprobs(trainer, data)
    rows = [Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "logprobs": lp,
                                                             "advantages": [1.0 if i % 2 else -1.0] * d.model_input.length})
            for i, (d, lp) in enumerate(zip(data, old))]
    fb = trainer.forward_backward(rows, "ppo").result()
    opt = trainer.optim_step(AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    return {"loss": fb.metrics["loss:sum"], "tokens": fb.metrics["tokens:weighted"], "grad_norm": opt.metrics["grad_norm"],
            "logprobs": [o["logprobs"].to_torch().tolist() for o in fb.loss_fn_outputs]}


def logprobs(trainer, data):
    return [o["logprobs"].to_torch().tolist() for o in trainer.forward(data, "cross_entropy").result().loss_fn_outputs]


def run(trainer, mode, steps=3):
    """``steps`` steps, then a checkpoint (its id, the logprobs it holds, the step after it), and
    that step again after loading the checkpoint back into this session."""
    from rlkit.backends.local.distributed import is_sharded, share

    engine = trainer._engine
    data = batch()
    layer = next(engine.decoder.layers[0].parameters())
    out = {"sharded": is_sharded(layer), "shares": [len(s) for s in share(data, engine.world_size, engine.group_shared_prefix)]}
    out["steps"] = [step(trainer, data) for _ in range(steps)]
    out["checkpoint"] = trainer.save_state(f"ranks-{mode}").result().model_package_arn
    out["digest"] = weights_digest(trainer)
    out["saved_logprobs"] = logprobs(trainer, data)
    out["next"] = step(trainer, data)
    trainer.load_state_with_optimizer(out["checkpoint"]).result()
    out["next_again"] = step(trainer, data)
    out["dpo"] = dpo_step(trainer, data)
    out["ppo"] = ppo_step(trainer, data)
    if engine.world_size > 1 and mode == "lora":  # a rank whose loop passes another batch: refused on every rank
        try:
            trainer.forward(data[:-1] if engine.rank == 1 else data, "cross_entropy").result()
            out["mismatch"] = None
        except InvalidInputError as exc:
            out["mismatch"] = str(exc)
    return out


def weights_digest(trainer):
    """A SHA-256 of the session's whole trained weights (gathered on N ranks: a collective)."""
    import hashlib

    snapshot = trainer._engine.adapter_snapshot()
    digest = hashlib.sha256()
    for key in sorted(snapshot):
        value = snapshot[key]
        for t in (value if isinstance(value, tuple) else (value,)):
            if torch.is_tensor(t):
                digest.update(key.encode() + t.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def resumed(service, checkpoint):
    """A session from another run's checkpoint: its weights' digest, logprobs and next step."""
    trainer = service.create_training_client_from_state_with_optimizer(checkpoint)
    data = batch()
    out = {"digest": weights_digest(trainer), "saved_logprobs": logprobs(trainer, data), "next": step(trainer, data)}
    trainer.stop()
    return out


def saved(trainer, mode):
    """One step, then ``save_state`` (its id, the logprobs it holds, the step after it) and the
    export (``save_weights_for_sampler``)."""
    data = batch()
    out = {"first": step(trainer, data)}
    out["checkpoint"] = trainer.save_state(f"dcp-{mode}").result().model_package_arn
    out["export"] = trainer.save_weights_for_sampler(f"export-{mode}").result().model_package_arn
    out["digest"] = weights_digest(trainer)
    out["saved_logprobs"] = logprobs(trainer, data)
    out["next"] = step(trainer, data)
    return out


def main(path, checkpoint_dir, previous=None, lean=None):
    service = rlkit.connect("local", precision="fp32", num_threads=1, activation_checkpointing=False, checkpoint_dir=checkpoint_dir)
    result = {}
    for mode in ("lora", "full"):
        if lean == "resume":
            with open(previous) as fh:
                result[mode] = resumed(service, json.load(fh)[mode]["checkpoint"])
            continue
        if mode == "lora":
            trainer = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
        else:
            trainer = service.create_full_training_client("tiny", seed=0)
        result[mode] = saved(trainer, mode) if lean == "save" else run(trainer, mode)
        trainer.stop()
        if previous:
            with open(previous) as fh:
                result[mode]["resumed"] = resumed(service, json.load(fh)[mode]["checkpoint"])
    service.close()
    if is_writer():
        with open(path, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])
