"""``rlkit.rl.datums.sequence_datum`` / ``group_datums``: sampled sequences -> RL datums, checked
against values written out by hand (the shift convention of docs/losses.md)."""

import math

import pytest

from rlkit.errors import InvalidInputError
from rlkit.rl.datums import group_datums, sequence_datum
from rlkit.types import SampledSequence, SampleResponse, StopReason


def _inputs(datum):
    return {k: list(v.data) for k, v in datum.loss_fn_inputs.items()}


def test_sequence_datum_matches_the_hand_computed_shift():
    # prompt [5, 6, 7] (P = 3), completion [8, 9] with sampler logprobs -0.5, -0.25, advantage 2
    seq = SampledSequence(stop_reason=StopReason("stop"), tokens=[8, 9], logprobs=[-0.5, -0.25])
    d = sequence_datum([5, 6, 7], seq, 2.0, temperature=0.7)
    assert d.model_input.to_ints() == [5, 6, 7, 8, 9]
    got = _inputs(d)
    assert got["target_tokens"] == [6, 7, 8, 9, 0]
    assert got["weights"] == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert got["logprobs"] == [0.0, 0.0, -0.5, -0.25, 0.0]
    assert got["advantages"] == [0.0, 0.0, 2.0, 2.0, 0.0]
    assert got["temperature"] == pytest.approx([0.7] * 5)
    assert "temperature" not in sequence_datum([5, 6, 7], seq, 2.0).loss_fn_inputs  # only when asked
    # plain token lists with logprobs given
    assert _inputs(sequence_datum([5], [8], -1.0, logprobs=[-0.1])) == {
        "target_tokens": [8, 0], "weights": [1.0, 0.0], "logprobs": [-0.1, 0.0], "advantages": [-1.0, 0.0]}
    with pytest.raises(InvalidInputError, match="2 completion tokens but 1 logprobs"):
        sequence_datum([5], [8, 9], 1.0, logprobs=[-0.1])
    with pytest.raises(InvalidInputError, match="no sampler logprobs"):
        sequence_datum([5], [8], 1.0)


def test_group_datums_uses_grpo_advantages_and_drops_equal_groups():
    seqs = [SampledSequence(stop_reason=StopReason("stop"), tokens=[10 + i], logprobs=[-1.0]) for i in range(3)]
    response = SampleResponse(sequences=seqs)
    datums = group_datums([1, 2], response, [1.0, 0.0, 0.0])
    # GRPO: mean 1/3, sample std (Bessel) sqrt(1/3): A = (r - 1/3) / sqrt(1/3)
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    want = [(1 - 1 / 3) / std, (-1 / 3) / std, (-1 / 3) / std]
    assert [d.loss_fn_inputs["advantages"].data[1] for d in datums] == pytest.approx(want, rel=1e-5)
    assert [d.model_input.to_ints() for d in datums] == [[1, 2, 10], [1, 2, 11], [1, 2, 12]]
    assert group_datums([1, 2], response, [0.5, 0.5, 0.5]) == []
    kept = group_datums([1, 2], seqs, [0.5, 0.5, 0.5], drop_zero_variance=False)
    assert len(kept) == 3 and all(set(d.loss_fn_inputs["advantages"].data) == {0.0} for d in kept)
    with pytest.raises(InvalidInputError, match="3 sequences but 2 rewards"):
        group_datums([1, 2], response, [1.0, 0.0])


def test_hand_built_datums_train_with_the_builtin_losses(trainer):
    """Datums from a real sample() run through ppo: on-policy ratios are 1 (the temperature input)."""
    import rlkit

    sampler = trainer.save_weights_and_get_sampling_client()
    prompt = [1, 2, 3, 4]
    params = rlkit.SamplingParams(max_tokens=4, temperature=0.9, seed=3)
    response = sampler.sample(prompt, num_samples=4, sampling_params=params).result()
    datums = group_datums(prompt, response, [1.0, 0.0, 0.5, 0.0], temperature=0.9)
    out = trainer.forward_backward(datums, "ppo").result()
    assert out.metrics["ppo/ratio:mean"] == pytest.approx(1.0, abs=1e-3)
    assert trainer.optim_step(rlkit.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm"] > 0
