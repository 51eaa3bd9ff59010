import pytest
import torch

from rlkit.errors import InvalidInputError
from rlkit.types import (
    AdamParams,
    Datum,
    EncodedTextChunk,
    ModelInput,
    SamplingParams,
    TensorData,
    TensorDtype,
)


def test_defaults_follow_the_sdk():
    a = AdamParams()
    assert (a.learning_rate, a.beta1, a.beta2, a.eps, a.weight_decay) == (1e-4, 0.9, 0.999, 1e-8, 0.01)
    assert a.grad_clip_norm is None and a.lora_plus_lr_ratio is None
    s = SamplingParams()
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed, s.stop) == (512, None, None, None, None, None)


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: AdamParams(learning_rte=1e-3), "learning_rte"),
        (lambda: AdamParams(learning_rate=-1.0), "AdamParams.learning_rate=-1.0"),
        (lambda: AdamParams(beta1=1.5), "AdamParams.beta1=1.5"),
        (lambda: AdamParams(eps=0), "AdamParams.eps=0"),
        (lambda: AdamParams(grad_clip_norm=0.0), "grad_clip_norm"),
        (lambda: SamplingParams(max_tokens=0), "SamplingParams.max_tokens=0"),
        (lambda: SamplingParams(temperature=-0.5), "temperature"),
        (lambda: SamplingParams(top_p=95), "top_p"),
        (lambda: SamplingParams(top_k=0), "top_k"),
        (lambda: SamplingParams(stop=[13]), "stop"),
        (lambda: SamplingParams(max_token=5), "max_token"),
    ],
)
def test_invalid_params_raise_one_line_rlkit_error(build, fragment):
    with pytest.raises(InvalidInputError) as info:
        build()
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_assignment_is_validated():
    a = AdamParams()
    with pytest.raises(InvalidInputError):
        a.learning_rate = -1


def test_stop_accepts_a_bare_string():
    assert SamplingParams(stop="\n").stop == ["\n"]


def test_model_input_helpers():
    mi = ModelInput.from_ints([1, 2, 3])
    assert mi.to_ints() == [1, 2, 3] and mi.length == 3
    longer = mi.append_int(4).append(EncodedTextChunk(tokens=[5, 6]))
    assert longer.to_ints() == [1, 2, 3, 4, 5, 6] and longer.length == 6
    assert mi.to_ints() == [1, 2, 3]  # unchanged


def test_tensor_data_round_trips_torch():
    t = torch.tensor([[1.5, 2.0], [3.0, 4.0]])
    td = TensorData.from_torch(t)
    assert td.dtype == TensorDtype.FLOAT32 and td.shape == [2, 2]
    assert td.tolist() == [1.5, 2.0, 3.0, 4.0]
    assert torch.equal(td.to_torch(), t)
    ints = TensorData.from_torch(torch.tensor([1, 2, 3]))
    assert ints.dtype == TensorDtype.INT64 and ints.to_torch().dtype == torch.int64
    assert TensorData(data=[1, 2], dtype="int64").to_torch().tolist() == [1, 2]


def test_datum_wraps_lists_and_tensors():
    d = Datum(
        model_input=ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 0], "weights": torch.tensor([0.0, 1.0, 0.0])},
    )
    assert d.loss_fn_inputs["target_tokens"].dtype == TensorDtype.INT64
    assert d.loss_fn_inputs["weights"].tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(InvalidInputError, match="weight"):
        Datum(model_input=ModelInput.from_ints([1]), weight=2.0)
