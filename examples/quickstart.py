"""rlkit at a glance: a few supervised steps on a handful of chat pairs, then sampling.

    python examples/quickstart.py                 # the embedded default, SmolLM2-135M-Instruct
    python examples/quickstart.py --model tiny    # a tiny random model, for a smoke test
    rlkit run examples/quickstart.py              # the same, on rlkit's allocator and Ctrl-C policy

The same code runs on SageMaker with ``rlkit.connect("sagemaker", region=..., role_arn=..., ...)``.
"""

from __future__ import annotations

import argparse
import time

import rlkit
from rlkit.chat import conversation_datum, prompt_tokens

PAIRS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is 12 + 30?", "12 + 30 = 42."),
    ("Name a primary colour.", "Red is a primary colour."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    service = rlkit.connect("local")
    with service.create_lora_training_client(args.model, rank=16, alpha=32, seed=0) as trainer:
        tokenizer = trainer.get_tokenizer()
        batch = [
            conversation_datum(tokenizer, [{"role": "user", "content": q}, {"role": "assistant", "content": a}])
            for q, a in PAIRS
        ]
        for step in range(args.steps):
            t0 = time.time()
            # Both calls return futures at once; the optim_step is queued behind the forward_backward.
            fwd_bwd = trainer.forward_backward(batch, loss_fn="cross_entropy")
            optim = trainer.optim_step(rlkit.AdamParams(learning_rate=1e-3))
            out = fwd_bwd.result()
            nll = out.metrics["loss:sum"] / out.metrics["tokens:weighted"]
            print(f"step {step}: nll/token {nll:.3f}  grad_norm {optim.result().metrics['grad_norm']:.3f}  ({time.time() - t0:.1f}s)")

        sampler = trainer.save_weights_and_get_sampling_client()
        prompt = prompt_tokens(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
        result = sampler.sample(
            rlkit.ModelInput.from_ints(prompt),
            num_samples=2,
            sampling_params=rlkit.SamplingParams(max_tokens=24, temperature=0.7, seed=0),
        ).result()
        for i, seq in enumerate(result.sequences):
            print(f"sample {i} ({seq.stop_reason.value}): {tokenizer.decode(seq.tokens, skip_special_tokens=True)!r}")
        print(f"tokens: prefill {result.usage.prefill_tokens}, decoded {result.usage.decode_tokens}")
    service.close()


if __name__ == "__main__":
    main()
