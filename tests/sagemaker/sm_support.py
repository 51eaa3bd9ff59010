"""Shared pieces of the SageMaker backend's tests: an in-process emulator with dummy credentials,
the emulator's tiny-model ARN, and small request builders. Tests skip when the SDK is missing."""

from __future__ import annotations

import contextlib
import os

import pytest

ROLE = "arn:aws:iam::123456789012:role/rlkit-tests"
REGION = "us-west-2"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": REGION}
CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE")


def require_sdk():
    return pytest.importorskip("sagemaker.train.training_session", reason="needs the sagemaker-train SDK (pip install 'rlkit[sagemaker]')")


def tiny_arn() -> str:
    from rlkit.backends.sagemaker.names import EMULATOR_MODELS, hub_content_arn

    return hub_content_arn(REGION, *EMULATOR_MODELS["tiny"])


@contextlib.contextmanager
def emulator_env(url: str):
    """Point the SDK at ``url`` with dummy credentials; restore the environment afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        for key in CLEARED:
            mp.delenv(key, raising=False)
        for key, value in CREDENTIALS.items():
            mp.setenv(key, value)
        mp.setenv("SAGEMAKER_TRAINING_SESSION_ENDPOINT", url)
        mp.setenv("SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT", url)
        yield


@contextlib.contextmanager
def running_emulator(tmp_path, **options):
    """An in-process emulator: strict answers (the default), on the fast cadence unless a test asks
    for the SDK's own (``cadence="sdk"``: 2 s result polls, 10 s creation polls)."""
    from rlkit.backends.sagemaker.emulator import Emulator

    options.setdefault("cadence", "fast")
    emu = Emulator(state_dir=str(tmp_path), **options).start()
    try:
        with emulator_env(emu.url):
            yield emu
    finally:
        emu.stop()


def session_statuses(emu) -> dict:
    return {name: s["status"] for name, s in emu.state.summary()["sessions"].items()}


def settled_status(emu, name: str, timeout: float = 20.0) -> str:
    """``name``'s status once it has left ``Stopping`` (the engine is released in the background,
    as the real service moves Stopping -> Stopped/Expired on its own time), or ``Stopping``."""
    import time

    deadline = time.monotonic() + timeout
    while (status := session_statuses(emu)[name]) == "Stopping" and time.monotonic() < deadline:
        time.sleep(0.05)
    return status


def raw_runtime_client(url: str):
    """A boto3 runtime client that sends what it is given (no client-side validation), to check
    what the emulator itself refuses."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sagemakertrainingsessionruntime", region_name=REGION, endpoint_url=url,
        aws_access_key_id="test", aws_secret_access_key="test",
        config=Config(parameter_validation=False, retries={"mode": "standard", "max_attempts": 1}),
    )


def no_retry_runtime_client(url: str):
    """Like :func:`raw_runtime_client`, with botocore's retries off (one attempt per call)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sagemakertrainingsessionruntime", region_name=REGION, endpoint_url=url,
        aws_access_key_id="test", aws_secret_access_key="test",
        config=Config(parameter_validation=False, retries={"mode": "standard", "total_max_attempts": 1}),
    )


def raw_control_client(url: str):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sagemaker", region_name=REGION, endpoint_url=url, aws_access_key_id="test", aws_secret_access_key="test",
        config=Config(parameter_validation=False, retries={"mode": "standard", "max_attempts": 1}),
    )


def wire_datum(tokens, weights=None, **extra):
    """A cross-entropy datum in the runtime's wire shape."""
    n = len(tokens)
    inputs = {
        "target_tokens": {"data": list(tokens[1:]) + [0], "dtype": "int64"},
        "weights": {"data": weights if weights is not None else [1.0] * (n - 1) + [0.0], "dtype": "float32"},
    }
    inputs.update(extra)
    return {"modelInput": {"chunks": [{"tokens": list(tokens), "type": "encoded_text"}]}, "lossFnInputs": inputs}


def session_request(name: str, **overrides) -> dict:
    request = {
        "TrainingSessionName": name,
        "LoraConfig": {"Rank": 4, "Alpha": 8},
        "RoleArn": ROLE,
        "ModelConfig": {"BaseModelArn": tiny_arn()},
        "OutputConfig": {"S3Location": {"Path": "s3://rlkit-tests/out"}},
    }
    request.update(overrides)
    return request


def env_for(url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(CREDENTIALS)
    env["SAGEMAKER_TRAINING_SESSION_ENDPOINT"] = url
    env["SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT"] = url
    return env
