"""The real sagemaker-train SDK against the strict emulator: a whole session, read through the SDK's
own documented accessors, with the same numbers as the local engine it is backed by (same LoRA
seed, same data); and one session on the SDK's own cadence (no long-poll: its 10 s creation polls
and 2 s result polls run as against the service)."""

import math
import re

import pytest

from sm_support import ROLE, REGION, require_sdk, running_emulator, session_statuses, tiny_arn

sdk = require_sdk()

import rlkit  # noqa: E402
from helpers import sft_datum  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def sdk_datum(datum):
    """The SDK's own types, built from an rlkit datum."""
    tokens = datum.model_input.to_ints()
    inputs = {
        "target_tokens": sdk.TensorData(data=datum.loss_fn_inputs["target_tokens"].tolist(), dtype=sdk.TensorDtype.INT64),
        "weights": sdk.TensorData(data=datum.loss_fn_inputs["weights"].tolist()),
    }
    return sdk.Datum(model_input=sdk.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with running_emulator(tmp_path_factory.mktemp("emulator")) as emu:
        yield emu


def test_sdk_session_roundtrip_matches_local_engine(emulator, tmp_path):
    svc = sdk.ServiceClient(region=REGION, role_arn=ROLE, s3_output_path="s3://rlkit-tests/out")
    local = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path / "local")
    tok = local.get_tokenizer("tiny")
    batch = [sft_datum(tok.encode(t), prompt_len=3) for t in ("hello there, tiny model", "the sum of 12 and 30 is 42")]
    tc = svc.create_lora_training_client(tiny_arn(), rank=4, alpha=8)
    assert re.fullmatch(r"sagemaker-training-session-[0-9a-f]{8}", tc.training_session_name)
    lt = local.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    try:
        for _ in range(2):  # pipelined: optim_step is queued behind forward_backward before either resolves
            fb = tc.forward_backward([sdk_datum(d) for d in batch], "cross_entropy")
            opt = tc.optim_step(sdk.AdamParams(learning_rate=5e-3))
            lfb, lopt = lt.forward_backward(batch), lt.optim_step(rlkit.AdamParams(learning_rate=5e-3))
            got, want = fb.result(timeout=60), lfb.result()
            # documented: throughput keys + actor/* mirrors (a per-datum mean); no loss outputs unasked
            assert {"global_token_num", "mfu", "promised_flops", "estimated_flops", "actor/pg_loss", "actor/grad_norm"} == set(got.metrics)
            assert math.isclose(got.metrics["actor/pg_loss"], want.metrics["loss:sum"] / len(batch), rel_tol=1e-6)
            assert got.loss_fn_outputs is None
            step = opt.result(timeout=60)
            assert step.metrics == {"actor/lr": 5e-3}
            assert math.isclose(got.metrics["actor/grad_norm"], lopt.result().metrics["grad_norm"], rel_tol=1e-5)

        saved = tc.save_state("after two steps").result(timeout=60)
        assert re.fullmatch(r"arn:aws:sagemaker:us-west-2:\d{12}:model-package/sagemaker-default/\d+", saved.model_package_arn)
        lsaved = lt.save_state("after two steps").result().model_package_arn

        # sampling from the saved weights: the same tokens as the local sampler for the same seed
        sc = tc.save_weights_and_get_sampling_client("weights")
        prompt = tok.encode("Say something.")
        params = {"max_tokens": 512, "temperature": 1.0, "seed": 7}
        resp = sc.sample(prompt, num_samples=3, sampling_params=sdk.SamplingParams(**params)).result(timeout=60)
        lresp = local.create_sampling_client(model_package_arn=lt.save_weights_for_sampler().result().model_package_arn).sample(
            prompt, num_samples=3, sampling_params=rlkit.SamplingParams(**params)).result()
        assert [s.tokens for s in resp.sequences] == [s.tokens for s in lresp.sequences]
        assert [s.stop_reason.value for s in resp.sequences] == [s.stop_reason.value for s in lresp.sequences]
        logprobs = sc.compute_logprobs(prompt).result(timeout=60)
        assert logprobs[0] is None and len(logprobs) == len(prompt)

        # a new session resumes the checkpoint with its optimizer: one more step matches the local twin's
        tc2 = svc.create_training_client_from_state_with_optimizer(saved.model_package_arn, rank=4, alpha=8)
        lt2 = local.create_training_client_from_state_with_optimizer(lsaved)
        assert tc2.training_session_name != tc.training_session_name
        fb2 = tc2.forward_backward([sdk_datum(d) for d in batch], "cross_entropy")
        opt2 = tc2.optim_step(sdk.AdamParams(learning_rate=5e-3))
        lfb2, lopt2 = lt2.forward_backward(batch), lt2.optim_step(rlkit.AdamParams(learning_rate=5e-3))
        got2 = fb2.result(timeout=60)
        assert math.isclose(got2.metrics["actor/pg_loss"], lfb2.result().metrics["loss:sum"] / len(batch), rel_tol=1e-6)
        opt2.result(timeout=60)
        assert math.isclose(got2.metrics["actor/grad_norm"], lopt2.result().metrics["grad_norm"], rel_tol=1e-5)
        tc2.stop()
    finally:
        tc.stop()
        local.close()

    statuses = {s.training_session_name: s.status.value for s in svc.list_sessions()}
    assert statuses[tc.training_session_name] in ("Stopping", "Stopped")
    assert statuses[tc2.training_session_name] in ("Stopping", "Stopped")
    detail = svc._sagemaker_client.describe_training_session(TrainingSessionName=tc.training_session_name)["TrainingSessionDetail"]
    usage = detail["BillableTokenUsage"]
    assert usage["TrainingTokenCount"] == 2 * sum(d.model_input.length for d in batch)
    assert usage["SampleTokenCount"] == sum(len(s.tokens) for s in resp.sequences)
    assert usage["PrefillTokenCount"] == 2 * len(prompt)  # the sample (prefilled once for 3) + compute_logprobs
    assert detail["LastReceivedSequenceNumber"] == 6  # fb, opt, fb, opt, saveState, saveWeights


def test_the_sdk_polls_on_its_own_cadence(tmp_path):
    """No long-poll and no blocking create: the SDK sees ``Created``/``Scheduled`` and waits with its
    own 10 s describe loop, and polls each operation's result until it completes (``cadence="sdk"``,
    what ``rlkit emulate sagemaker`` does by default). Slow on purpose: ~12 s of the SDK's sleeps."""
    with running_emulator(tmp_path, cadence="sdk", startup_delay_s=0.4) as emu:
        seen = []
        original = emu.state.describe

        def spy(session):
            seen.append(session.status)
            return original(session)

        emu.state.describe = spy
        svc = sdk.ServiceClient(region=REGION, role_arn=ROLE, s3_output_path="s3://rlkit-tests/out")
        tc = svc.create_lora_training_client(tiny_arn(), rank=4, alpha=8)
        assert seen[0] in ("Created", "Scheduled") and seen[-1] == "Running"
        tok = rlkit.connect("local", checkpoint_dir=tmp_path / "local").get_tokenizer("tiny")
        batch = [sdk_datum(sft_datum(tok.encode("one two three four five"), prompt_len=2))]
        fb = tc.forward_backward(batch, "cross_entropy")  # the first submit meets the warm-up; the SDK retries
        assert fb.result(timeout=60).metrics["global_token_num"] == batch[0].model_input.length
        stats = emu.state.stats
        assert stats["warmup_errors"] == 1 and stats["requests:ExecuteTrainingOperation"] == 2
        assert stats["requests:GetTrainingOperationResult"] == 2  # "still running", then 2 s later the result
        tc.stop()
        assert session_statuses(emu)[tc.training_session_name] in ("Stopping", "Stopped")
