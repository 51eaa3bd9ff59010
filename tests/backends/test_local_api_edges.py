"""Edges of the Python API: values that used to be accepted and fail later (or never) are refused
where they are given, naming the datum and key; tiny temperatures are greedy."""

import math

import pytest
import torch
from helpers import adapter_state, same_state, sft_datum

from rlkit.errors import InvalidInputError
from rlkit.rl.datums import trajectory_datum
from rlkit.rl.env import Trajectory, Transition
from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams, TensorData

TOKENS = [1, 40, 41, 42, 2]
GOOD = sft_datum(TOKENS, prompt_len=2)


def test_non_numeric_weights_are_refused_when_the_datum_is_built():
    with pytest.raises(InvalidInputError, match=r"loss_fn_inputs\['weights'\]\[0\]='a' is not a number"):
        Datum(
            model_input=ModelInput.from_ints(TOKENS),
            loss_fn_inputs={"target_tokens": TOKENS[1:] + [0], "weights": ["a"] * 5},
        )
    with pytest.raises(InvalidInputError, match=r"TensorData.data\[2\]=None: not a number"):
        TensorData(data=[1.0, 0.0, None])


def test_non_numeric_weights_in_a_dict_batch_name_the_datum(trainer):
    bad = {
        "model_input": ModelInput.from_ints(TOKENS),
        "loss_fn_inputs": {"target_tokens": TOKENS[1:] + [0], "weights": ["a"] * 5},
    }
    with pytest.raises(
        InvalidInputError, match=r"forward_backward: batch\[1\]: .*\['weights'\]\[0\]='a' is not a number"
    ):
        trainer.forward_backward([GOOD, bad])


def test_float_target_tokens_are_refused_not_truncated(trainer):
    with pytest.raises(InvalidInputError, match=r"\['target_tokens'\]\[1\]=41.5 is not a token id"):
        Datum(
            model_input=ModelInput.from_ints(TOKENS),
            loss_fn_inputs={"target_tokens": [40, 41.5, 42, 2, 0], "weights": [1.0] * 5},
        )
    typed = TensorData(data=[40, 41.5, 42, 2, 0], dtype="int64")  # would become 41 in an int64 tensor
    tensor = TensorData.from_torch(torch.tensor([40.0, 41.0, 42.7, 2.0, 0.0]))
    for targets in (typed, tensor):
        datum = Datum(
            model_input=ModelInput.from_ints(TOKENS), loss_fn_inputs={"target_tokens": targets, "weights": [1.0] * 5}
        )
        with pytest.raises(
            InvalidInputError, match=r"datum\[1\].loss_fn_inputs\['target_tokens'\]\[\d\] is 4\d\.\d+, not a token id"
        ):
            trainer.forward_backward([GOOD, datum])
    whole = Datum(
        model_input=ModelInput.from_ints(TOKENS),
        loss_fn_inputs={"target_tokens": [40.0, 41, 42, 2, 0], "weights": [1] * 5},
    )
    assert whole.loss_fn_inputs["target_tokens"].to_torch().tolist() == [40, 41, 42, 2, 0]  # whole floats are ids


def test_forward_backward_longer_than_the_context_is_refused_like_sample(trainer):
    n = trainer._engine.max_positions
    long = sft_datum([1] + [40] * n, prompt_len=1)  # n + 1 tokens
    with pytest.raises(
        InvalidInputError, match=rf"forward_backward: datum\[1\] has {n + 1} tokens; the model's context window is {n}"
    ):
        trainer.forward_backward([GOOD, long])
    with pytest.raises(InvalidInputError, match="context window"):
        trainer.forward([long])
    with pytest.raises(InvalidInputError, match="context window"):
        trainer.create_sampling_client().sample([1] + [40] * n)
    fits = sft_datum([1] + [40] * (n - 1), prompt_len=1)  # exactly n tokens: accepted
    assert math.isfinite(trainer.forward([fits]).result().metrics["loss:sum"])


@pytest.mark.parametrize(
    "field, value",
    [
        ("learning_rate", math.inf),
        ("learning_rate", math.nan),
        ("learning_rate", -1e-3),
        ("beta1", math.nan),
        ("beta2", 1.0),
        ("eps", math.inf),
        ("eps", 0.0),
        ("weight_decay", -0.1),
        ("weight_decay", math.inf),
        ("grad_clip_norm", math.inf),
        ("lora_plus_lr_ratio", math.nan),
    ],
)
def test_adam_params_refuse_non_finite_and_out_of_range_values(field, value):
    with pytest.raises(InvalidInputError, match=rf"AdamParams.{field}="):
        AdamParams(**{field: value})


def test_optim_step_with_infinite_learning_rate_is_refused_and_changes_nothing(trainer):
    trainer.forward_backward([GOOD]).result()
    before = adapter_state(trainer)
    with pytest.raises(InvalidInputError, match="learning_rate=inf: Input should be a finite number"):
        trainer.optim_step({"learning_rate": math.inf})
    assert same_state(before, adapter_state(trainer))
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    assert all(bool(torch.isfinite(p).all()) for _, p in trainer._engine.named_trainable)


def test_sampling_params_refuse_non_finite_values():
    for field in ("temperature", "top_p"):
        with pytest.raises(InvalidInputError, match=rf"SamplingParams.{field}=inf"):
            SamplingParams(**{field: math.inf})


@pytest.mark.parametrize("temperature", [1e-45, 1e-12, 5e-7])
def test_tiny_temperatures_are_greedy(service, temperature):
    sampler = service.create_sampling_client(base_model="tiny")
    prompt = [1, 85, 91, 326, 71]
    greedy = sampler.sample(prompt, 2, SamplingParams(max_tokens=8, temperature=0.0)).result()
    tiny = sampler.sample(prompt, 2, SamplingParams(max_tokens=8, temperature=temperature, seed=3)).result()
    for g, t in zip(greedy.sequences, tiny.sequences):
        assert t.tokens == g.tokens
        assert t.logprobs == g.logprobs and all(math.isfinite(x) for x in t.logprobs)


def test_tiny_temperature_as_a_loss_input_is_refused_and_rl_datums_leave_it_out(trainer):
    datum = sft_datum(TOKENS, prompt_len=2, temperature=[1e-45] * 5)
    with pytest.raises(InvalidInputError, match=r"datum\[0\].loss_fn_inputs\['temperature'\] must be >= 1e-06"):
        trainer.forward([datum])
    trajectory = Trajectory(
        transitions=[Transition(observation=[1, 40], action=[41, 42], action_logprobs=[-1.0, -1.0])]
    )
    assert "temperature" not in trajectory_datum(trajectory, 1.0, temperature=1e-45).loss_fn_inputs
    assert "temperature" in trajectory_datum(trajectory, 1.0, temperature=0.7).loss_fn_inputs
