"""rlkit's SageMaker adapter (rlkit.connect("sagemaker")) against the emulator, side by side with the
local backend: same numbers, the max_tokens rule, linearised losses, call-site errors, hygiene."""

import math
import re

import pytest

from sm_support import require_sdk, running_emulator, session_statuses

require_sdk()

import rlkit  # noqa: E402
from helpers import rl_datum, sft_datum  # noqa: E402
from rlkit.errors import CheckpointNotFoundError, ClientStoppedError, InvalidInputError  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with running_emulator(tmp_path_factory.mktemp("emulator")) as emu:
        yield emu


@pytest.fixture(scope="module")
def services(emulator, tmp_path_factory):
    sm = rlkit.connect("sagemaker")
    local = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path_factory.mktemp("local"))
    yield sm, local
    sm.close()
    local.close()


def _batch(tok):
    return [sft_datum(tok.encode(t), prompt_len=3) for t in ("hello there, tiny model", "the sum of 12 and 30 is 42")]


def test_training_sampling_checkpoints_match_local(services, emulator):
    sm, local = services
    trainer = sm.create_lora_training_client("tiny", rank=4, alpha=8)
    twin = local.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    tok = trainer.get_tokenizer()
    batch = _batch(tok)
    for step in range(2):
        fb, opt = trainer.forward_backward(batch, return_logprobs=True), trainer.optim_step(rlkit.AdamParams(learning_rate=5e-3))
        lfb, lopt = twin.forward_backward(batch), twin.optim_step(rlkit.AdamParams(learning_rate=5e-3))
        out, want = fb.result(timeout=60), lfb.result()
        # the strict service returns no per-token logprobs: asked for, the session scored them (same numbers)
        assert trainer.logprobs_source == "scoring" and out.metrics["logprobs:from_service"] == 0.0
        assert out.metrics["logprobs:scored_tokens"] == sum(d.model_input.length + 1 for d in batch) == out.usage.prefill_tokens
        for got_lp, want_lp in zip(out.loss_fn_outputs, want.loss_fn_outputs):
            assert got_lp["logprobs"].to_torch().shape[0] == want_lp["logprobs"].to_torch().shape[0]
            assert float((got_lp["logprobs"].to_torch() - want_lp["logprobs"].to_torch()).abs().max()) < 1e-5
        for key in ("loss:sum", "tokens:weighted", "cross_entropy/nll:mean"):  # computed from them, as locally
            assert math.isclose(out.metrics[key], want.metrics[key], rel_tol=1e-6), key
        assert out.usage.train_tokens == sum(d.model_input.length for d in batch) == out.metrics["global_token_num"]
        if step:  # the bill is read after each optim_step, in the background: it lags one step
            assert out.metrics["billing/training_tokens"] > 0
        # the service reports actor/grad_norm with the pass; optim_step carries it
        assert math.isclose(opt.result(timeout=60).metrics["grad_norm"], lopt.result().metrics["grad_norm"], rel_tol=1e-5)
        assert math.isclose(out.metrics["grad_norm"], out.metrics["actor/grad_norm"])

    # max_tokens below the service's 512: sampled at 512, cut here; same tokens as the local backend
    sampler = trainer.save_weights_and_get_sampling_client("w")
    lsampler = twin.save_weights_and_get_sampling_client("w")
    prompt = tok.encode("Say something about 3.")
    params = rlkit.SamplingParams(max_tokens=5, temperature=1.0, seed=11)
    got = sampler.sample(prompt, num_samples=4, sampling_params=params).result(timeout=60)
    want = lsampler.sample(prompt, num_samples=4, sampling_params=params).result()
    assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
    assert [s.stop_reason for s in got.sequences] == [s.stop_reason for s in want.sequences]
    assert all(math.isclose(a, b, abs_tol=1e-5) for s, t in zip(got.sequences, want.sequences) for a, b in zip(s.logprobs, t.logprobs))
    assert got.usage.prefill_tokens == len(prompt)
    assert got.usage.decode_tokens >= sum(len(s.tokens) for s in got.sequences)  # billed: what the service decoded
    assert want.usage.decode_tokens == sum(len(s.tokens) for s in want.sequences)
    got = sampler.sample(prompt, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=2).result(timeout=60)
    want = lsampler.sample(prompt, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=2).result()
    assert got.prompt_logprobs[0] is None and len(got.prompt_logprobs) == len(prompt)
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]))
    assert got.topk_prompt_logprobs[0] is None and len(got.topk_prompt_logprobs) == len(prompt)
    assert [[t.token_id for t in p] for p in got.topk_prompt_logprobs[1:]] == [[t.token_id for t in p] for p in want.topk_prompt_logprobs[1:]]
    lp = sampler.compute_logprobs(prompt).result(timeout=60)
    wlp = lsampler.compute_logprobs(prompt).result()
    assert lp[0] is None and all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(lp[1:], wlp[1:]))

    # checkpoints are model-package ARNs; a later session restores rank/alpha from the ARN alone
    arn = trainer.save_state("two steps").result(timeout=60).model_package_arn
    assert re.fullmatch(r"arn:aws:sagemaker:us-west-2:\d{12}:model-package/[\w-]+/\d+", arn)
    info = sm.describe_checkpoint(arn)
    assert (info["base_model"], info["rank"], info["alpha"], info["kind"]) == ("tiny", 4, 8, "checkpoint")
    resumed = sm.create_training_client_from_state_with_optimizer(arn)
    ltwin = local.create_training_client_from_state_with_optimizer(twin.save_state().result().model_package_arn)
    a = resumed.forward_backward(batch).result(timeout=60).metrics["loss:sum"]
    assert math.isclose(a, ltwin.forward_backward(batch).result().metrics["loss:sum"], rel_tol=1e-6)
    a = resumed.optim_step(rlkit.AdamParams(learning_rate=5e-3)).result(timeout=60).metrics["grad_norm"]
    assert math.isclose(a, ltwin.optim_step(rlkit.AdamParams(learning_rate=5e-3)).result().metrics["grad_norm"], rel_tol=1e-5)
    for client in (resumed, trainer, twin, ltwin):
        client.stop()
    statuses = session_statuses(emulator)
    assert statuses[trainer.name] in ("Stopping", "Stopped") and statuses[resumed.name] in ("Stopping", "Stopped")


def test_forward_backward_scores_nothing_unless_asked(services, emulator):
    """A built-in loss is the service's: without ``return_logprobs`` no compute_logprobs, no save,
    and the loss, per-datum losses and train NLL (:func:`rlkit.losses.weighted_nll`) still read
    as locally."""
    from rlkit.losses import weighted_nll

    sm, local = services
    trainer = sm.create_lora_training_client("tiny", rank=4, alpha=8)
    twin = local.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    batch = _batch(trainer.get_tokenizer())
    stats = emulator.state.stats
    before = (stats["sampling_ops_received"], stats["model_packages_registered"])
    out, want = trainer.forward_backward(batch).result(timeout=60), twin.forward_backward(batch).result()
    assert (stats["sampling_ops_received"], stats["model_packages_registered"]) == before
    assert out.metrics["logprobs:scored_tokens"] == 0 and out.usage.prefill_tokens == 0
    assert all("logprobs" not in o for o in out.loss_fn_outputs)
    assert math.isclose(out.metrics["loss:sum"], want.metrics["loss:sum"], rel_tol=1e-5)
    assert out.metrics["tokens:weighted"] == want.metrics["tokens:weighted"]
    assert math.isclose(weighted_nll(out, batch), weighted_nll(want, batch), rel_tol=1e-5)
    from rlkit.losses import CrossEntropy, run_loss

    got = run_loss(trainer, batch, CrossEntropy(), aggregation="token_mean").result(timeout=60)
    assert math.isclose(weighted_nll(got, batch, "token_mean"), weighted_nll(want, batch), rel_tol=1e-4)  # the scale undone
    assert math.isnan(weighted_nll(run_loss(trainer, batch, CrossEntropy(), aggregation="seq_mean").result(timeout=60), batch, "seq_mean"))
    assert stats["sampling_ops_received"] == before[0]
    # asked through run_loss: scored, once per distinct datum

    asked = run_loss(trainer, batch + batch[:1], CrossEntropy(), logprobs=True).result(timeout=60)
    assert stats["sampling_ops_received"] == before[0] + len(batch)
    assert all("logprobs" in o for o in asked.loss_fn_outputs) and len(asked.loss_fn_outputs) == len(batch) + 1
    trainer.stop()


def test_non_builtin_loss_runs_linearised_with_the_same_gradient(services):
    """DPO is not a SageMaker built-in: forward -> dL/dlogp on the client -> weighted cross-entropy."""
    from rlkit.losses import DPO, run_loss

    sm, local = services
    trainer = sm.create_lora_training_client("tiny", rank=4, alpha=8)
    twin = local.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    assert not trainer.supports_builtin_loss("dpo") and trainer.supports_builtin_loss("ppo", {"clip_high_threshold": 1.3})
    tok = trainer.get_tokenizer()
    prompt = tok.encode("Q: 2+2? A:")
    chosen, rejected = prompt + tok.encode(" 4"), prompt + tok.encode(" 5")
    ref = [0.0] * len(chosen)
    data = [sft_datum(chosen, prompt_len=len(prompt), ref_logprobs=ref), sft_datum(rejected, prompt_len=len(prompt), ref_logprobs=ref)]
    out = trainer.forward_backward(data, DPO(beta=0.1)).result(timeout=60)  # a Loss object: linearised by the adapter
    assert out.metrics["linearised"] == 1.0
    lout = run_loss(twin, data, DPO(beta=0.1)).result()  # the local engine runs it natively
    assert math.isclose(out.metrics["loss:sum"], lout.metrics["loss:sum"], rel_tol=1e-5)
    g1 = trainer.optim_step(rlkit.AdamParams(learning_rate=1e-3)).result(timeout=60).metrics["grad_norm"]
    g2 = twin.optim_step(rlkit.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm"]
    assert math.isclose(g1, g2, rel_tol=1e-4)
    trainer.stop()
    twin.stop()


def test_call_site_errors_name_the_problem(services):
    sm, _ = services
    trainer = sm.create_lora_training_client("tiny", rank=4, alpha=8)
    tok = trainer.get_tokenizer()
    good = sft_datum(tok.encode("hello there"), prompt_len=2)
    bad = rl_datum(tok.encode("hello there"), [0.0] * 3, 1.0)  # 3 logprobs for more tokens
    with pytest.raises(InvalidInputError, match=r"datum\[0\]\.loss_fn_inputs\['logprobs'\] has 3 values"):
        trainer.forward_backward([bad], "ppo")
    with pytest.raises(InvalidInputError, match="unknown loss_fn 'grpo'"):
        trainer.forward_backward([good], "grpo")
    with pytest.raises(InvalidInputError, match=r"(?i)learning_rate=0.05 is outside the SageMaker service's range"):
        trainer.optim_step(rlkit.AdamParams(learning_rate=0.05))
    with pytest.raises(InvalidInputError, match="rank=512"):
        sm.create_lora_training_client("tiny", rank=512)
    with pytest.raises(CheckpointNotFoundError):
        sm.create_training_client_from_state("arn:aws:sagemaker:us-west-2:123456789012:model-package/nope/1")
    trainer.stop()
    trainer.stop()  # idempotent
    with pytest.raises(ClientStoppedError):
        trainer.forward_backward([good])


def test_close_stops_every_session_it_created(emulator):
    svc = rlkit.connect("sagemaker")
    a = svc.create_lora_training_client("tiny", rank=4, alpha=8)
    b = svc.create_sampling_client(base_model="tiny")  # an implicit session of its own
    assert b.sample([1, 2, 3], sampling_params={"max_tokens": 3, "seed": 1}).result(timeout=60).sequences[0].tokens
    listed = {s["training_session_name"]: s["status"] for s in svc.list_sessions(status="Running")}
    assert a.name in listed and b.training_session_name in listed
    svc.close()
    statuses = session_statuses(emulator)
    assert statuses[a.name] in ("Stopping", "Stopped") and statuses[b.training_session_name] in ("Stopping", "Stopped")
    svc.close()  # idempotent


def test_a_loop_that_raises_still_stops_its_session(emulator):
    names = []
    with pytest.raises(RuntimeError, match="the loop failed"):
        with rlkit.connect("sagemaker") as svc:
            trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
            names.append(trainer.name)
            raise RuntimeError("the loop failed")
    assert session_statuses(emulator)[names[0]] in ("Stopping", "Stopped")


def test_a_batch_over_the_request_limit_is_split_and_merged_like_micro_batches(services, monkeypatch, emulator):
    import sagemaker.train.training_session._utils as sdk_utils

    monkeypatch.setattr(sdk_utils, "MAX_CHUNK_LEN", 1)  # one datum per request
    sm, local = services
    trainer = sm.create_lora_training_client("tiny", rank=4, alpha=8)
    twin = local.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    batch = _batch(trainer.get_tokenizer())
    out = trainer.forward_backward(batch, return_logprobs=True).result(timeout=60)
    want = twin.forward_backward(batch).result()
    assert emulator.state.summary()["sessions"][trainer.name]["last_received_seq"] == 3  # two requests + the scoring save
    assert len(out.loss_fn_outputs) == 2 and out.usage.train_tokens == want.usage.train_tokens
    for key in ("loss:sum", "tokens:weighted", "tokens:train", "cross_entropy/nll:mean"):
        assert math.isclose(out.metrics[key], want.metrics[key], rel_tol=1e-6), key
    g1 = trainer.optim_step(rlkit.AdamParams(learning_rate=1e-3)).result(timeout=60).metrics["grad_norm"]
    assert math.isclose(g1, twin.optim_step(rlkit.AdamParams(learning_rate=1e-3)).result().metrics["grad_norm"], rel_tol=1e-5)
    trainer.stop()
    twin.stop()


def test_lora_layers_the_service_picks_are_refused_not_ignored(services, capsys):
    """SageMaker selects the LoRA layers itself: asking for MLP-only or attention-only training is a
    one-line refusal (by the client, and by rlkit train before any session), never a silent difference."""
    from rlkit.cli import main

    sm, _local = services
    with pytest.raises(InvalidInputError, match="train_mlp=False.*cannot be honoured on sagemaker"):
        sm.create_lora_training_client("tiny", rank=4, train_mlp=False)
    assert main(["train", "recipe=sft_gsm8k_smoke", "backend=sagemaker", "model.train_mlp=false"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("rlkit: error: model.train_mlp=false: SageMaker selects")


def test_a_seed_the_real_service_cannot_take_warns_where_a_plain_script_sees_it(monkeypatch):
    """Against SageMaker itself (not the emulator, which seeds like local) a LoRA seed is not sent:
    the warnings module says so (a plain script sees it; a logger line it would not)."""
    import warnings

    from rlkit.backends.sagemaker import adapter, creation
    from rlkit.errors import RlkitWarning

    svc = adapter.SageMakerServiceClient.__new__(adapter.SageMakerServiceClient)
    svc.emulated, svc._closed, svc.role_arn = False, False, "arn:aws:iam::1:role/r"
    monkeypatch.setattr(svc, "resolve_base_model", lambda name: "arn:base", raising=False)
    monkeypatch.setattr(creation, "create_session", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop here")))
    monkeypatch.setattr(adapter, "translate", lambda exc, *a: exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="stop here"):
            svc.create_lora_training_client("tiny", rank=4, seed=3)
    assert any(issubclass(w.category, RlkitWarning) and "seed=3 is not sent" in str(w.message) for w in caught)
