"""The emulator's sessions end cleanly and only their owner's signatures pass: stopping a session
skips its queued training operations and cancels its running samples (the running operation
finishes), an ended session is forgotten after ``ended_session_ttl_s``, and with a secret access
key every request's SigV4 signature is verified (the real SDK passes; another secret, a changed
body or a stale date is a 403 in the service's error shape)."""

from __future__ import annotations

import time

import pytest
from sm_support import CREDENTIALS, raw_control_client, raw_runtime_client, require_sdk, running_emulator, session_request

require_sdk()
from botocore.exceptions import ClientError  # noqa: E402

PROMPT = {"chunks": [{"tokens": [5, 6, 7], "type": "encoded_text"}]}
STEP = {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.001}}}


def wait_status(get, want, seconds=10.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        out = get()
        if out["status"] == want:
            return out
        time.sleep(0.05)
    raise AssertionError(f"never {want}: {out}")


def test_a_stopped_session_skips_its_queued_work_and_is_forgotten_after_the_ttl(tmp_path, monkeypatch):
    from rlkit.backends.sagemaker.emulator import runtime as runtime_module

    with running_emulator(tmp_path, warmup_errors=0) as emu:
        control, runtime = raw_control_client(emu.url), raw_runtime_client(emu.url)
        control.create_training_session(**session_request("ending"))
        # an operation reaches a terminal status even when building its result fails
        def broken(*args, **kwargs):
            raise RuntimeError("cannot build the result")

        monkeypatch.setattr(runtime_module.strict, "optim_result", broken)
        op = runtime.execute_training_operation(trainingSessionName="ending", sequenceNumber=1, clientToken="t1", operationConfig=STEP)["operationId"]
        out = wait_status(lambda: runtime.get_training_operation_result(trainingSessionName="ending", operationId=op), "Failed")
        assert "cannot build the result" in out["errorDetails"]
        monkeypatch.undo()
        session = emu.state.sessions["ending"]
        running = session.trainer._submit(lambda: time.sleep(1.0), operation="slow")  # the engine is busy
        ops = [runtime.execute_training_operation(trainingSessionName="ending", sequenceNumber=seq, clientToken=f"t{seq}",
                                                  operationConfig=STEP)["operationId"] for seq in (2, 3)]
        big = {"sample": {"prompt": PROMPT, "numSamples": emu.options.max_num_samples,
                          "samplingParams": {"maxTokens": 2000, "seed": 1}}}
        sample = runtime.execute_sampling_operation(trainingSessionName="ending", operationConfig=big)["operationId"]
        time.sleep(0.3)
        t0 = time.time()
        control.stop_training_session(TrainingSessionName="ending")
        out = wait_status(lambda: runtime.get_sampling_operation_result(trainingSessionName="ending", operationId=sample), "Skipped")
        assert "ended (Stopped)" in out["errorDetails"] and time.time() - t0 < 3, out  # stopped at its next decode step
        for op in ops:
            out = wait_status(lambda op=op: runtime.get_training_operation_result(trainingSessionName="ending", operationId=op), "Skipped")
            assert "before this operation ran" in out["errorDetails"], out
        running.result(timeout=10)  # the running operation finished
        wait_status(lambda: {"status": control.describe_training_session(TrainingSessionName="ending")
                             ["TrainingSessionDetail"]["TrainingSessionStatus"]}, "Stopped")
        assert emu.state.stats["training_ops_executed"] == 0 and not session.inflight  # the failed step 1 is not counted
        listed = lambda: [s["TrainingSessionArn"].rsplit("/", 1)[1] for s in control.list_training_sessions()["TrainingSessionSummaries"]]  # noqa: E731
        assert listed() == ["ending"]  # listed while its TTL runs
        emu.options.ended_session_ttl_s = 0.0
        deadline = time.time() + 5
        while "ending" in emu.state.sessions and time.time() < deadline:
            time.sleep(0.05)
        assert listed() == [] and emu.state.stats["sessions_purged"] == 1
        with pytest.raises(ClientError) as info:
            control.describe_training_session(TrainingSessionName="ending")
        assert info.value.response["Error"]["Code"] == "ResourceNotFound"


def _client(url, service, secret):
    import boto3
    from botocore.config import Config

    return boto3.client(service, region_name=CREDENTIALS["AWS_REGION"], endpoint_url=url,
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=secret,
                        config=Config(retries={"mode": "standard", "max_attempts": 1}))


def test_signatures_are_verified_with_the_secret_key(tmp_path, monkeypatch):
    import datetime as dt

    import botocore.auth

    import rlkit

    secret = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    with running_emulator(tmp_path, access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], secret_access_key=secret) as emu:
        with rlkit.connect("sagemaker") as svc:  # the real sagemaker-train SDK, signing with the right secret
            trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
            assert trainer.optim_step(rlkit.AdamParams(learning_rate=1e-3)).result(timeout=60).metrics is not None
            trainer.stop()
        assert emu.state.stats.get("errors:InvalidSignatureException", 0) == 0
        assert "secret_access_key" not in _config(emu)  # the secret is never shown
        refused = []
        for service in ("sagemaker", "sagemakertrainingsessionruntime"):
            wrong = _client(emu.url, service, "not-the-secret")
            with pytest.raises(ClientError) as info:
                if service == "sagemaker":
                    wrong.list_training_sessions()
                else:
                    wrong.get_training_operation_result(trainingSessionName="x", operationId="y")
            refused.append(info.value.response)
        for response in refused:
            assert response["ResponseMetadata"]["HTTPStatusCode"] == 403
            assert response["Error"]["Code"] == "InvalidSignatureException", response
        right = _client(emu.url, "sagemaker", secret)
        assert "TrainingSessionSummaries" in right.list_training_sessions()

        def tamper(request, **kwargs):  # the body changed after it was signed
            request.body = request.body.replace(b"{}", b'{"MaxResults": 1}') if request.body == b"{}" else request.body + b" "

        right.meta.events.register_last("before-send.sagemaker.ListTrainingSessions", tamper)
        with pytest.raises(ClientError) as info:
            right.list_training_sessions()
        assert "does not match" in info.value.response["Error"]["Message"], info.value.response
        stale = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(minutes=20)
        monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: stale)
        with pytest.raises(ClientError) as info:
            _client(emu.url, "sagemaker", secret).list_training_sessions()
        assert "Signature expired" in info.value.response["Error"]["Message"], info.value.response


def _config(emu):
    import json
    import urllib.request

    with urllib.request.urlopen(emu.url + "/_emulator/config", timeout=10) as resp:
        return json.loads(resp.read())


def test_a_secret_needs_its_access_key_and_remote_listening_needs_both(tmp_path):
    from rlkit.backends.sagemaker.emulator import Emulator
    from rlkit.errors import ConfigError

    with pytest.raises(ConfigError, match="needs --access-key-id"):
        Emulator(state_dir=str(tmp_path / "a"), secret_access_key="s")
    emu = Emulator(state_dir=str(tmp_path / "b"), allow_remote=True, access_key_id="AKID")
    try:
        with pytest.raises(ConfigError, match="secret-access-key"):
            emu.bind("0.0.0.0", 0)
    finally:
        emu.state.close()
