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


#: the three runs of the multi-run tests (per-row LoRA, the fusing scheduler): rank, alpha, seed —
#: a different rank per run
THREE_RUNS = {"a": (2, 4, 11), "b": (4, 16, 12), "c": (8, 8, 13)}
THREE_RUNS_LOSSES = {"a": "cross_entropy", "b": "ppo", "c": "cross_entropy"}


def three_runs_data(key, prompt):
    """Run ``key``'s batch: a: two SFT rows; b: a PPO group of three completions of ``prompt`` (it
    shares the prompt through the engine's shared-prompt path when ``prompt`` has >= 16 tokens);
    c: one SFT row."""
    if key == "a":
        return [sft_datum([1, 40, 41, 42, 43, 44, 45, 2], prompt_len=2), sft_datum([1, 50, 51, 52, 2], prompt_len=2)]
    if key == "b":
        return [rl_datum(prompt + c, [-1.5] * (len(prompt) + len(c)), adv, prompt_len=len(prompt))
                for c, adv in (([60, 61, 62, 2], 1.0), ([70, 71, 2], -0.5), ([80, 81, 82, 83, 84, 2], 0.25))]
    return [sft_datum([1, 90, 91, 92, 93, 94, 95, 96, 97, 98, 2], prompt_len=4)]
