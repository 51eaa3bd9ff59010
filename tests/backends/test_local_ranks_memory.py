"""Memory per rank on 2 ranks (issue 42 item 6, :mod:`rlkit.backends.local.rank_memory`): once a
session's engine has sharded the base, a rank holds its half of the decoder layers and the
replicated embeddings, not the whole loaded copy (counted by tensor storage, not RSS); its
sampler loads the whole base at its first sample, and samples exactly as one process does.

One ``torchrun --nproc-per-node 2`` launch of this file (its ``__main__``) on the tiny model;
the one-process reference runs in the test's own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import rlkit
from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

PROMPT = [5, 17, 99, 230, 41]


def _data():
    g = torch.Generator().manual_seed(0)
    rows = []
    for length in (9, 23, 14, 6):
        tokens = torch.randint(3, 500, (length,), generator=g).tolist()
        rows.append(Datum(model_input=ModelInput.from_ints(tokens),
                          loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": [1.0] * (length - 1) + [0.0]}))
    return rows


def _samples(client):
    """Greedy and seeded samples of ``PROMPT`` (tokens and logprobs)."""
    out = []
    for params in (SamplingParams(max_tokens=12, temperature=0.0), SamplingParams(max_tokens=12, temperature=1.0, seed=7)):
        seqs = client.sample(ModelInput.from_ints(PROMPT), num_samples=2, sampling_params=params).result().sequences
        out.append([{"tokens": s.tokens, "logprobs": s.logprobs} for s in seqs])
    return out


def scenario(checkpoint_dir) -> dict:
    """A LoRA session on ``tiny``: what this process holds once its engine is built, after a
    step, then samples from the base and from the trained adapter (the same code on 1 or 2 ranks)."""
    from rlkit.backends.local.rank_memory import held_tensor_bytes

    service = rlkit.connect("local", precision="fp32", num_threads=1, activation_checkpointing=False, checkpoint_dir=checkpoint_dir)
    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    runtime = trainer._runtime
    out = {"rank": trainer._engine.rank, "held_engine": held_tensor_bytes()["bytes"], "base_held_engine": runtime.loaded.held}
    trainer.forward_backward(_data(), "cross_entropy").result()
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    out["held_step"] = held_tensor_bytes()["bytes"]
    out["base"] = _samples(service.create_sampling_client(base_model="tiny"))
    out["trained"] = _samples(trainer.save_weights_and_get_sampling_client())
    out["held_sampled"] = held_tensor_bytes()["bytes"]
    trainer.stop()
    service.close()
    return out


def _tiny_bytes():
    """(decoder-layer weight bytes, every other weight's bytes) of the tiny model."""
    from rlkit.backends.local.models import load_model

    model = load_model("tiny").model
    layers = {id(p) for p in model.model.layers.parameters()}
    sizes = {id(p): p.numel() * p.element_size() for p in model.parameters()}  # ties counted once
    return sum(v for k, v in sizes.items() if k in layers), sum(v for k, v in sizes.items() if k not in layers)


def test_two_ranks_hold_half_the_base_until_they_sample_then_sample_as_one_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    one = scenario(tmp_path / "one")
    layers, rest = _tiny_bytes()
    for two in ranks:
        assert not two["base_held_engine"]  # the runtime let the whole loaded copy go once the engine sharded it
        # this rank: half the decoder layers, the replicated embeddings and norms, the adapter and a
        # little else (measured ~0.59 of the base on tiny, whose layers are 82% of it); before the
        # fix, ~1.9x the base (the loaded copy, the sampler's fused copies and the shards)
        assert two["held_engine"] < rest + 0.5 * layers + 0.1 * (rest + layers)
        assert two["held_step"] < rest + 0.5 * layers + 0.15 * (rest + layers)  # + optimizer state, still no whole base
        assert two["held_sampled"] > rest + layers  # sampling loads the whole base for the sampler, as documented
        assert two["base"] == one["base"]  # the same bits: the reloaded base is the loaded one
        for a, b in zip(one["trained"], two["trained"]):  # the adapter trained on 2 ranks: the same step up to rounding
            for x, y in zip(a, b):
                assert x["tokens"] == y["tokens"]
                assert torch.allclose(torch.tensor(x["logprobs"]), torch.tensor(y["logprobs"]), atol=1e-4)
    assert one["held_engine"] > rest + layers  # one process: the whole base, shared by its sampler and session


if __name__ == "__main__":
    from rlkit.backends.local.distributed import init

    rank, _ = init()
    result = scenario(Path(sys.argv[1]) / "ckpt")
    (Path(sys.argv[1]) / f"rank{rank}.json").write_text(json.dumps(result))
