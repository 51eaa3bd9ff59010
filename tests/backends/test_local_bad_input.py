"""Bad input is refused at the call site with a one-line rlkit error, and changes nothing."""

import pytest

from helpers import adapter_state, rl_datum, same_state, sft_datum
from rlkit.errors import CheckpointNotFoundError, ClientStoppedError, InvalidInputError, RlkitError
from rlkit.types import AdamParams, Datum, ModelInput

GOOD = sft_datum([1, 40, 41, 42, 2], prompt_len=2)


def with_inputs(**inputs):
    return Datum(model_input=ModelInput.from_ints([1, 40, 41, 42, 2]), loss_fn_inputs=inputs)


CASES = [
    ("missing key", [with_inputs(target_tokens=[40, 41, 42, 2, 0])], "cross_entropy", None, r"datum\[0\] is missing loss_fn_inputs \['weights'\]"),
    ("extra key", [with_inputs(target_tokens=[40, 41, 42, 2, 0], weights=[1.0] * 5, bogus=[0.0] * 5)], "cross_entropy", None, r"unexpected loss_fn_inputs \['bogus'\]"),
    ("short weights", [GOOD, with_inputs(target_tokens=[40, 41, 42, 2, 0], weights=[1.0] * 4)], "cross_entropy", None, r"datum\[1\].loss_fn_inputs\['weights'\] has 4 values for 5 tokens"),
    ("target out of vocab", [with_inputs(target_tokens=[40, 41, 9999, 2, 0], weights=[1.0] * 5)], "cross_entropy", None, r"9999, outside the vocabulary"),
    ("input token out of vocab", [Datum(model_input=ModelInput.from_ints([1, 70000]), loss_fn_inputs={"target_tokens": [1, 0], "weights": [1.0, 0.0]})], "cross_entropy", None, r"datum\[0\].model_input holds token 70000"),
    ("unknown loss", [GOOD], "dpo", None, r"unknown loss_fn 'dpo'"),
    ("ppo without advantages", [GOOD], "ppo", None, r"missing loss_fn_inputs \['advantages', 'logprobs'\]|missing loss_fn_inputs \['logprobs', 'advantages'\]"),
    ("nan advantage", [rl_datum([1, 40, 41, 2], [-1.0] * 4, float("nan"))], "ppo", None, r"advantages'\]\[0\] is nan"),
    ("bad clip", [rl_datum([1, 40, 41, 2], [-1.0] * 4, 1.0)], "ppo", {"clip_low_threshold": 1.5}, r"clip_low_threshold=1.5"),
    ("empty batch", [], "cross_entropy", None, r"empty batch"),
    ("not a datum", [[1, 2, 3]], "cross_entropy", None, r"batch\[0\] is a list, not a Datum"),
]


@pytest.mark.parametrize("label, data, loss, config, pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_batches_are_refused_before_any_state_changes(trainer, label, data, loss, config, pattern):
    trainer.forward_backward([GOOD]).result()
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    before = adapter_state(trainer)
    with pytest.raises(InvalidInputError, match=pattern) as info:
        trainer.forward_backward(data, loss, loss_fn_config=config)
    assert "\n" not in str(info.value)
    assert all(p.grad is None for _, p in trainer._engine.named_trainable)
    # still usable
    trainer.forward_backward([GOOD]).result()
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    assert not same_state(before, adapter_state(trainer))


def test_bad_params_and_ids(trainer, service):
    with pytest.raises(InvalidInputError):
        trainer.optim_step({"learning_rate": -1})
    with pytest.raises(InvalidInputError, match="optim_step: adam_params: expected AdamParams"):
        trainer.optim_step(0.1)
    sc = trainer.create_sampling_client()
    with pytest.raises(InvalidInputError, match="num_samples"):
        sc.sample([1, 2], num_samples=0)
    with pytest.raises(InvalidInputError, match="max_tokens"):
        sc.sample([1, 2], sampling_params={"max_tokens": -3})
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        sc.sample([1, 99999])
    with pytest.raises(InvalidInputError, match="prompt is empty"):
        sc.sample([])
    with pytest.raises(InvalidInputError, match="context window"):
        sc.sample([1] * 5000)
    for bad in ("local:///nope/nothing", "not-a-checkpoint", ""):
        with pytest.raises(CheckpointNotFoundError, match="checkpoint"):
            trainer.load_state(bad)
        with pytest.raises(CheckpointNotFoundError):
            service.create_sampling_client(model_package_arn=bad or "x")
    with pytest.raises(InvalidInputError, match="unknown keyword"):
        service.create_lora_training_client("tiny", rnak=4)


def test_weights_only_checkpoint_cannot_restore_optimizer(trainer):
    ck = trainer.save_weights_for_sampler().result().path
    with pytest.raises(InvalidInputError, match="weights only"):
        trainer.load_state_with_optimizer(ck)


def test_stopped_clients_refuse_work(service):
    client = service.create_lora_training_client("tiny", rank=4, alpha=8)
    sc = client.create_sampling_client()
    client.forward_backward([GOOD])
    client.stop()
    client.stop()  # idempotent
    for call in (lambda: client.forward_backward([GOOD]), lambda: client.optim_step(), lambda: client.save_state()):
        with pytest.raises(ClientStoppedError, match="stopped"):
            call()
    sc.stop()
    with pytest.raises(ClientStoppedError):
        sc.sample([1, 2])
    assert client.name not in [s["training_session_name"] for s in service.list_sessions()]


def test_failed_operation_leaves_session_usable(trainer):
    """A loss that blows up mid-run fails its future only; gradients are restored."""
    from rlkit.losses import CrossEntropy

    class Exploding(CrossEntropy):
        name = "exploding"

        def compute(self, data, logprobs):
            loss, metrics = super().compute(data, logprobs)
            return loss * float("inf"), metrics

    trainer.forward_backward([GOOD]).result()
    grads = [p.grad.clone() for _, p in trainer._engine.named_trainable]
    future = trainer.forward_backward([GOOD], Exploding())
    with pytest.raises(RlkitError, match="not finite"):
        future.result()
    for (_, p), g in zip(trainer._engine.named_trainable, grads):
        assert p.grad is not None and (p.grad == g).all()
    assert trainer.optim_step().result().metrics["grad_norm"] > 0
