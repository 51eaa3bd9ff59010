"""``rlkit.connect("tinker")`` over the real SDK, against the Tinker-compatible server: every SDK
difference bridged, and the native built-ins' gradients equal to rlkit's own loss objects'
(linearised on the client) and to the local engine's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tinker")

import rlkit  # noqa: E402
from helpers import rl_datum, sft_datum  # noqa: E402
from rlkit.errors import ClientStoppedError, InvalidInputError  # noqa: E402
from rlkit.losses import CISPO, PPO, CrossEntropy, ImportanceSampling  # noqa: E402
from rlkit.losses.execute import run_loss  # noqa: E402
from rlkit.types import AdamParams, SamplingParams, TensorData  # noqa: E402

ALPHA = 8
TOKENS = [5, 17, 42, 99, 7, 250, 31, 64, 12, 300, 8]
LINEAR_ADAM = AdamParams(learning_rate=1e-2, eps=10.0, weight_decay=0.0)  # eps >> |g|: the step is ~ lr * g / eps


@pytest.fixture(scope="module")
def tinker_server(tmp_path_factory):  # this module's server uses the local runs' alpha, so results compare
    from rlkit.backends.tinker.server import TinkerServer

    server = TinkerServer(state_dir=str(tmp_path_factory.mktemp("state")), lora_alpha=ALPHA).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def svc(tinker_server):
    service = rlkit.connect("tinker", base_url=tinker_server.url, api_key="tml-test", lora_alpha=ALPHA)
    yield service
    service.close()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    service = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path_factory.mktemp("local"))
    yield service
    service.close()


def rl_batch():
    q = [-6.0 + 0.1 * i for i in range(len(TOKENS))]
    batch = [rl_datum(TOKENS, q, 0.8, prompt_len=3), rl_datum(TOKENS[::-1], q, -0.5, prompt_len=2)]
    for d in batch:  # non-uniform positive weights: folded into the advantages for Tinker
        w = d.loss_fn_inputs["weights"].to_torch()
        d.loss_fn_inputs["weights"] = TensorData.from_torch(w * torch.linspace(0.5, 1.5, len(w)))
    return batch


def step(trainer, batch, loss, *, linearised=False):
    """One accumulate + optimizer step; the grad norm and the logprobs after it."""
    before = trainer.forward([sft_datum(TOKENS)]).result().loss_fn_outputs[0]["logprobs"].to_torch()
    if linearised:
        out = run_loss(trainer, batch, loss, force_linearised=True).result()
    else:
        out = trainer.forward_backward(batch, loss).result()
    grad = trainer.optim_step(LINEAR_ADAM).result().metrics["grad_norm"]
    after = trainer.forward([sft_datum(TOKENS)]).result().loss_fn_outputs[0]["logprobs"].to_torch()
    assert (after - before).abs().max() > 1e-3  # the step moved the model well beyond the tolerance below
    return out.metrics["loss:sum"], grad, after


@pytest.mark.parametrize("loss", [CrossEntropy(), ImportanceSampling(), PPO(0.9, 1.1), CISPO()], ids=lambda x: x.name)
def test_native_builtins_have_rlkit_gradients(svc, local, loss):
    batch = [sft_datum(TOKENS, prompt_len=3)] if loss.name == "cross_entropy" else rl_batch()
    native = step(svc.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=3), batch, loss)
    linear = step(svc.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=3), batch, loss, linearised=True)
    engine = step(local.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=3), batch, loss)
    for other in (linear, engine):
        assert native[0] == pytest.approx(other[0], rel=1e-5, abs=1e-6)
        assert native[1] == pytest.approx(other[1], rel=1e-4)
        assert torch.allclose(native[2], other[2], atol=1e-5)
    assert native[1] > 0


def test_ppo_with_a_negative_weight_runs_linearised_with_rlkit_maths(svc, local):
    batch = rl_batch()
    w = batch[0].loss_fn_inputs["weights"].to_torch()
    w[5] = -1.0  # w * min(rA, clip(r)A) != min(r wA, clip(r) wA): not Tinker's ppo any more
    batch[0].loss_fn_inputs["weights"] = TensorData.from_torch(w)
    got = step(svc.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=4), batch, PPO())
    want = step(local.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=4), batch, PPO())
    assert got[0] == pytest.approx(want[0], rel=1e-5) and got[1] == pytest.approx(want[1], rel=1e-4)
    assert torch.allclose(got[2], want[2], atol=1e-5)


def test_adam_defaults_lora_options_and_seed_are_rlkit_s(svc, local, tinker_server):
    batch = [sft_datum(TOKENS, prompt_len=2)]

    def three_steps(trainer):
        for _ in range(3):
            trainer.forward_backward(batch).result()
            trainer.optim_step(
                AdamParams(learning_rate=5e-3)
            ).result()  # rlkit's defaults: beta2 .999, eps 1e-8, wd .01
        return trainer.forward(batch).result().loss_fn_outputs[0]["logprobs"].to_torch()

    with pytest.raises(InvalidInputError, match=r"alpha=64 cannot be honoured on tinker.*alpha=8"):
        svc.create_lora_training_client("tiny", rank=4, alpha=64, seed=5)  # the service's scale is fixed
    remote = three_steps(svc.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=5))  # alpha is not sent
    here = three_steps(local.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=5))
    assert torch.allclose(remote, here, atol=1e-5)
    other_seed = three_steps(svc.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=6))
    assert not torch.allclose(remote, other_seed, atol=1e-4)
    attn_only = svc.create_lora_training_client("tiny", rank=2, alpha=ALPHA, train_mlp=False, seed=0)
    lora = tinker_server.state.runs[attn_only.name].trainer._engine.lora
    assert (lora.train_mlp, lora.train_attn, lora.train_unembed, lora.rank) == (False, True, False, 2)
    with pytest.raises(InvalidInputError, match="LoRA\\+"):
        attn_only.optim_step(AdamParams(lora_plus_lr_ratio=4.0))


def test_checkpoint_names_tinker_paths_and_resume(svc):
    trainer = svc.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=1)
    batch = [sft_datum(TOKENS, prompt_len=2)]
    trainer.forward_backward(batch).result()
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    described = trainer.save_state("run 7 / step 1").result().model_package_arn
    named = trainer.save_state(name="exact-name").result().model_package_arn
    assert described.startswith(f"tinker://{trainer.name}/weights/run-7-step-1-") and named.endswith(
        "/weights/exact-name"
    )
    at_save = trainer.forward(batch).result().metrics["loss:sum"]
    trainer.forward_backward(batch).result()
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    resumed = svc.create_training_client_from_state_with_optimizer(named)
    assert resumed.forward(batch).result().metrics["loss:sum"] == pytest.approx(at_save, rel=1e-6)
    old_name = trainer.name
    trainer.load_state_with_optimizer(named).result()  # Tinker: a new training client from the path
    assert trainer.name != old_name and trainer.forward(batch).result().metrics["loss:sum"] == pytest.approx(
        at_save, rel=1e-6
    )
    weights = trainer.save_weights_for_sampler("for sampling").result().model_package_arn
    assert "/sampler_weights/for-sampling-" in weights
    scored = trainer.create_sampling_client(weights).compute_logprobs(TOKENS).result()
    lp = trainer.forward([sft_datum(TOKENS)]).result().loss_fn_outputs[0]["logprobs"].to_torch()
    assert scored[0] is None and torch.allclose(torch.tensor(scored[1:]), lp[:-1], atol=1e-4)


def test_sampling_and_refusals(svc):
    trainer = svc.create_lora_training_client("tiny", rank=4, alpha=ALPHA, seed=2)
    sampler = trainer.save_weights_and_get_sampling_client()
    out = sampler.sample(
        "hello", num_samples=3, sampling_params=SamplingParams(max_tokens=4, seed=1, temperature=0.7)
    ).result()
    assert len(out.sequences) == 3 and all(len(s.tokens) == len(s.logprobs) <= 4 for s in out.sequences)
    assert out.usage.decode_tokens == sum(len(s.tokens) for s in out.sequences)
    base = svc.create_sampling_client(base_model="tiny")
    assert base.compute_logprobs([1, 2, 3]).result()[0] is None
    with pytest.raises(InvalidInputError, match="temperature 1 only"):
        trainer.forward_backward([sft_datum(TOKENS, temperature=[0.5] * len(TOKENS))]).result()
    with pytest.raises(InvalidInputError, match="unknown loss_fn"):
        trainer.forward_backward([sft_datum(TOKENS)], "gspo_typo")
    trainer.stop()
    with pytest.raises(ClientStoppedError):
        trainer.forward_backward([sft_datum(TOKENS)])
