"""The real ``tinker`` SDK against ``rlkit serve tinker`` on the tiny model: every client method,
the losses' maths recomputed from the returned logprobs, checkpoints, REST, refusals."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

TOKENS = [5, 17, 42, 99, 7, 250, 31, 64, 12, 300, 8]


def ce_datum(tokens=TOKENS, prompt=3):
    n = len(tokens) - 1
    weights = [0.0 if i < prompt - 1 else 1.0 for i in range(n)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def rl_datum(tokens, q, adv, prompt=3):
    """Tinker's RL datum: no weights; prompt positions carry advantage 0."""
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * (prompt - 1) + list(q),
            "advantages": [0.0] * (prompt - 1) + [adv] * (n - prompt + 1),
        },
    )


def logprobs_of(out, i=0):
    return torch.tensor(out.loss_fn_outputs[i]["logprobs"].tolist(), dtype=torch.float64)


@pytest.fixture(scope="module")
def trainer(tinker_service):
    return tinker_service.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()


def test_info_tokenizer_and_cross_entropy_maths(trainer):
    info = trainer.get_info()
    assert info.model_data.model_name == "tiny" and info.lora_rank == 4 and info.is_lora
    tok = trainer.get_tokenizer()  # loaded by the SDK from get_info's tokenizer_id, offline
    assert tok.decode(tok.encode("hello world")) == "hello world"
    datum = ce_datum()
    out = trainer.forward([datum], "cross_entropy").result()
    lp = logprobs_of(out)
    w = torch.tensor(datum.loss_fn_inputs["weights"].tolist(), dtype=torch.float64)
    assert len(lp) == len(TOKENS) - 1 and (lp < 0).all()
    assert out.metrics["loss:sum"] == pytest.approx(float(-(w * lp).sum()), rel=1e-5)
    assert trainer.forward([datum], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        out.metrics["loss:sum"], rel=1e-6
    )


def test_forward_backward_chunks_in_order_and_optim_step_learns(tinker_server, trainer):
    batch = [ce_datum(TOKENS[i:] + TOKENS[:i]) for i in range(5)]  # 3 chunks (the server allows 2 datums each)
    before = trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    for _ in range(3):
        fb = trainer.forward_backward(batch, "cross_entropy")
        opt = trainer.optim_step(types.AdamParams(learning_rate=3e-2))
        out = fb.result()
        assert len(out.loss_fn_outputs) == 5
        assert opt.result().metrics["grad_norm"] > 0
    after = trainer.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    assert after < before - 1.0
    executed = tinker_server.state.summary()["runs"][trainer.model_id]["executed_seqs"]
    assert executed == list(range(1, len(executed) + 1))


@pytest.mark.parametrize(
    "loss_fn,config",
    [
        ("importance_sampling", None),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("cispo", None),
    ],
)
def test_rl_losses_without_weights(trainer, loss_fn, config):
    base = trainer.forward([ce_datum()], "cross_entropy").result()
    p = logprobs_of(base)[2:]
    q = (p + torch.linspace(-0.3, 0.3, len(p), dtype=torch.float64)).tolist()  # a sampler that lags the trainer
    datum = rl_datum(TOKENS, q, adv=0.7)
    out = trainer.forward([datum], loss_fn, config).result()
    lp = logprobs_of(out)[2:]
    r = torch.exp(lp - torch.tensor(q, dtype=torch.float64))
    lo, hi = (config or {}).get("clip_low_threshold", 0.8), (config or {}).get("clip_high_threshold", 1.2)
    expected = {
        "importance_sampling": -(r * 0.7).sum(),
        "ppo": -torch.minimum(r * 0.7, r.clamp(lo, hi) * 0.7).sum(),
        "cispo": -(r.clamp(lo, hi) * 0.7 * lp).sum(),
    }[loss_fn]
    assert out.metrics["loss:sum"] == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("loss_fn", ["gspo", "dro", "stable_reinforce", "no_such_loss"])
def test_unsupported_losses_fail_with_a_clear_error_and_the_run_goes_on(trainer, loss_fn):
    with pytest.raises(tinker.RequestFailedError, match=f"loss_fn '{loss_fn}'"):
        trainer.forward_backward([rl_datum(TOKENS, [-1.0] * 8, 1.0)], loss_fn).result()
    assert trainer.forward([ce_datum()], "cross_entropy").result().metrics["loss:sum"] > 0


def test_images_and_audio_are_refused(trainer):
    image = types.ImageChunk(data=b"\x89PNG....", format="png", expected_tokens=4)
    datum = types.Datum(
        model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]), image]),
        loss_fn_inputs={"target_tokens": [2, 3, 4, 5, 6, 7], "weights": [1.0] * 6},
    )
    with pytest.raises(tinker.RequestFailedError, match="image chunks are not supported"):
        trainer.forward([datum], "cross_entropy").result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    with pytest.raises(tinker.BadRequestError, match="image chunks are not supported"):
        sampler.sample(
            types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]), image]),
            1,
            types.SamplingParams(max_tokens=2),
        ).result()


def test_sampling_logprobs_stop_tokens_and_scoring(trainer):
    sampler = trainer.save_weights_and_get_sampling_client().result()
    assert sampler.get_base_model() == "tiny"
    prompt = types.ModelInput.from_ints(TOKENS[:4])
    greedy = (
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])).result().sequences[0]
    )
    assert len(greedy.tokens) == 6 and greedy.stop_reason == "length" and len(greedy.logprobs) == 6
    stop_at = greedy.tokens[2]
    cut = (
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0.0, stop=[stop_at]))
        .result()
        .sequences[0]
    )
    assert cut.stop_reason == "stop" and cut.tokens == greedy.tokens[: greedy.tokens.index(stop_at) + 1]
    group = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=5, seed=3)).result()
    assert len(group.sequences) == 4 and len({s.sequence_id for s in group.sequences}) == 4
    again = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=5, seed=3)).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in group.sequences]
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    trained = logprobs_of(trainer.forward([ce_datum(prompt=1)], "cross_entropy").result())
    assert scored[0] is None and len(scored) == len(TOKENS)
    assert torch.allclose(torch.tensor(scored[1:], dtype=torch.float64), trained, atol=1e-4)
    res = sampler.sample(
        prompt, 1, types.SamplingParams(max_tokens=1), include_prompt_logprobs=True, topk_prompt_logprobs=3
    ).result()
    assert res.prompt_logprobs[0] is None and len(res.topk_prompt_logprobs) == 4
    assert math.isclose(res.prompt_logprobs[1], scored[1], abs_tol=1e-5)
    assert max(lp for _, lp in res.topk_prompt_logprobs[1]) >= res.prompt_logprobs[1] - 1e-6


def test_checkpoints_rest_and_resume(tinker_service, trainer):
    datum = ce_datum()
    saved = trainer.save_state("ckpt-a").result().path
    assert saved == f"tinker://{trainer.model_id}/weights/ckpt-a"
    loss_at_save = trainer.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    sampler_path = trainer.save_weights_for_sampler("samp-a").result().path
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert trainer.forward([datum], "cross_entropy").result().metrics["loss:sum"] != pytest.approx(loss_at_save)

    resumed = tinker_service.create_training_client_from_state_with_optimizer(saved).result()
    assert resumed.get_info().lora_rank == 4
    assert resumed.forward([datum], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        loss_at_save, rel=1e-6
    )
    fresh = tinker_service.create_training_client_from_state(saved).result()
    assert fresh.forward([datum], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(loss_at_save, rel=1e-6)
    with pytest.warns(FutureWarning):
        trainer.load_state(saved).result()
    assert trainer.forward([datum], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        loss_at_save, rel=1e-6
    )

    from_path = tinker_service.create_sampling_client(model_path=sampler_path).result()
    assert from_path.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()[0] is None
    rest = tinker.RestClient(base_url=tinker_service._base_url, api_key="tml-test")
    listed = {c.tinker_path: c.checkpoint_type for c in rest.list_checkpoints(trainer.model_id).result().checkpoints}
    assert listed[saved] == "training" and listed[sampler_path] == "sampler"
    run = rest.get_training_run_by_tinker_path(saved).result()
    assert run.training_run_id == trainer.model_id and run.lora_rank == 4 and run.base_model == "tiny"
    assert rest.get_weights_info_by_tinker_path(saved).result().lora_rank == 4
    assert trainer.model_id in {r.training_run_id for r in rest.list_training_runs().result().training_runs}
    rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    assert sampler_path not in {c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result().checkpoints}
    with pytest.raises(Exception, match="no checkpoint"):
        tinker_service.create_sampling_client(model_path=sampler_path).result()


def test_custom_loss_runs_forward_then_linear_backward(trainer):
    datum = ce_datum()

    def neg_mean_lp(data, logprobs):
        lp = logprobs[0]
        return -lp[2:].mean(), {"n": float(len(lp))}

    out = trainer.forward_backward_custom([datum], neg_mean_lp).result()
    lp = logprobs_of(trainer.forward([datum], "cross_entropy").result())
    assert out.metrics["loss:sum"] == pytest.approx(float(-lp[2:].mean()), rel=1e-5)
    trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result()


def test_deprecated_async_forms(tinker_service):
    async def main():
        tc = await tinker_service.create_lora_training_client_async("tiny", rank=2, seed=1)
        info = await tc.get_info_async()
        assert info.lora_rank == 2
        fb = await tc.forward_backward_async([ce_datum()], "cross_entropy")
        opt = await tc.optim_step_async(types.AdamParams(learning_rate=1e-2))
        assert (await fb).metrics["loss:sum"] > 0 and (await opt).metrics["grad_norm"] > 0
        fwd = await (await tc.forward_async([ce_datum()], "cross_entropy"))
        path = (await (await tc.save_state_async("async-a"))).path
        spath = (await (await tc.save_weights_for_sampler_async("async-s"))).path
        sampler = await tc.save_weights_and_get_sampling_client_async()
        seqs = await sampler.sample_async(types.ModelInput.from_ints(TOKENS[:3]), 2, types.SamplingParams(max_tokens=3))
        lps = await sampler.compute_logprobs_async(types.ModelInput.from_ints(TOKENS[:5]))
        other = await tc.create_sampling_client_async(spath)
        base = await tinker_service.create_sampling_client_async(base_model="tiny")
        assert await base.get_base_model_async() == "tiny"
        resumed = await tinker_service.create_training_client_from_state_with_optimizer_async(path)
        again = await (await resumed.forward_async([ce_datum()], "cross_entropy"))
        return fwd, seqs, lps, other, again

    fwd, seqs, lps, other, again = asyncio.run(main())
    assert len(seqs.sequences) == 2 and lps[0] is None and len(lps) == 5
    assert again.metrics["loss:sum"] == pytest.approx(fwd.metrics["loss:sum"], rel=1e-6)
    assert other.compute_logprobs(types.ModelInput.from_ints(TOKENS[:3])).result()[0] is None


def test_unknown_base_model_and_bad_names_are_one_line_errors(tinker_service, trainer):
    with pytest.raises(Exception, match="base model 'no/such-model' is not served here"):
        tinker_service.create_lora_training_client(base_model="no/such-model", rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match="checkpoint name"):
        trainer.save_state("../escape").result()
    with pytest.raises(tinker.BadRequestError, match="record_stability_info"):
        trainer.save_weights_and_get_sampling_client(record_stability_info=True).result().sample(
            types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=1)
        ).result()
