"""Sample from weight version k after version k+1 was published, on vLLM (backend.sampler=vllm).

    bash scripts/install.sh vllm
    .venv/bin/python examples/vllm_versions.py                    # rlkit's tiny model, a server started here
    .venv/bin/python examples/vllm_versions.py --url http://host:8000 --model smollm2-135m-instruct

Version 0 is the fresh adapter; the trainer then fits a fixed continuation and publishes version 1.
The client bound to version 0 must still give version 0's greedy tokens (its requests name adapter
``<session>-v0``, and every answer is checked to come from it); version 1 gives the fitted ones.
Exit code 1 if not.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import rlkit
from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams


def sft_datum(tokens, prompt_len):
    weights = [0.0 if i < prompt_len - 1 else 1.0 for i in range(len(tokens))]
    weights[-1] = 0.0
    return Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": weights})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--url", action="append", default=[], help="a running vLLM server (repeatable); none: start one here")
    ap.add_argument("--dir", default="runs/vllm_versions")
    args = ap.parse_args()
    vllm = {"urls": args.url} if args.url else {"launch": True, "log_dir": args.dir, "dtype": "float32"}
    with rlkit.connect("local", sampler="vllm", vllm=vllm, precision="fp32", checkpoint_dir=str(Path(args.dir) / "checkpoints")) as service:
        trainer = service.create_lora_training_client(args.model, rank=8)
        tok = trainer.get_tokenizer()
        prompt = tok.encode("The answer is", add_special_tokens=False)
        target = tok.encode(" forty-two, exactly forty-two.", add_special_tokens=False)
        greedy = SamplingParams(max_tokens=len(target), temperature=0.0)

        t0 = time.perf_counter()
        v0 = trainer.save_weights_and_get_sampling_client()
        k0 = v0.sample(prompt, sampling_params=greedy).result().sequences[0].tokens
        print(f"version 0 ({v0.model}) published and sampled in {time.perf_counter() - t0:.1f} s: {tok.decode(k0)!r}")
        for _ in range(12):
            trainer.forward_backward([sft_datum(prompt + target, len(prompt))]).result()
            trainer.optim_step(AdamParams(learning_rate=3e-2)).result()
        v1 = trainer.save_weights_and_get_sampling_client()
        k1 = v1.sample(prompt, sampling_params=greedy).result().sequences[0].tokens
        print(f"version 1 ({v1.model}): {tok.decode(k1)!r}")
        again = v0.sample(prompt, sampling_params=greedy).result().sequences[0].tokens
        print(f"version 0 again, after version 1 was published: {tok.decode(again)!r}")
        print("servers:", service.server_status())
        ok = again == k0 and k1 != k0
        print("OK: version 0 kept its tokens" if ok else "FAILED: version 0's tokens changed or version 1 learned nothing")
        del v0
        import gc

        gc.collect()
        print("after version 0's client is gone:", service.server_status())
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
