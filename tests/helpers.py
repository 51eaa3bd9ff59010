"""Small builders shared by tests."""

from __future__ import annotations

from rlkit.types import Datum, ModelInput


def sft_datum(tokens, prompt_len=0, **extra):
    """A cross-entropy datum: targets shifted by one, prompt positions and the last weighted 0."""
    n = len(tokens)
    weights = [0.0 if i < max(prompt_len - 1, 0) else 1.0 for i in range(n)]
    weights[-1] = 0.0
    inputs = {"target_tokens": list(tokens[1:]) + [0], "weights": weights, **extra}
    return Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def rl_datum(tokens, sampler_logprobs, advantage, prompt_len=1):
    n = len(tokens)
    weights = [0.0] * n
    for i in range(prompt_len - 1, n - 1):
        weights[i] = 1.0
    return Datum(
        model_input=ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": list(tokens[1:]) + [0],
            "weights": weights,
            "logprobs": list(sampler_logprobs),
            "advantages": [advantage] * n,
        },
    )


def adapter_state(trainer):
    """A detached copy of a training client's LoRA tensors (for equality checks)."""
    return {k: (a.clone(), b.clone()) for k, (a, b, _s) in trainer._engine.lora_modules().items()}


def same_state(s1, s2, atol=0.0):
    import torch

    assert s1.keys() == s2.keys()
    for k in s1:
        for x, y in zip(s1[k], s2[k]):
            if atol == 0.0:
                if not torch.equal(x, y):
                    return False
            elif not torch.allclose(x, y, atol=atol, rtol=0):
                return False
    return True
