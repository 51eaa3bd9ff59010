"""Every backend's training client and service client refuse the same bad calls with the same line:
the checks are :class:`rlkit.engine.clients.TrainingClientBase`'s and
:class:`rlkit.engine.service.ServiceClientBase`'s, written once, so a backend that implements only
the primitives cannot drift (local; Tinker against ``rlkit serve tinker``'s server; SageMaker
against the strict emulator)."""

from __future__ import annotations

import os

import pytest

import rlkit
from helpers import sft_datum
from rlkit.errors import CheckpointNotFoundError, ClientStoppedError, InvalidInputError
from rlkit.losses import CrossEntropy
from rlkit.engine import TrainingClient

TOKENS = [5, 17, 42, 99, 7, 250, 31, 64, 12, 300, 8]
NOT_EXACTLY_ONE = "create_sampling_client: pass exactly one of base_model= or model_package_arn="


def _local(tmp):
    return rlkit.connect("local", precision="fp32", checkpoint_dir=tmp), (lambda: None)


def _tinker(tmp):
    pytest.importorskip("tinker", reason="needs the tinker SDK")
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    from rlkit.backends.tinker.server import TinkerServer

    server = TinkerServer(state_dir=str(tmp), lora_alpha=8).start()
    return rlkit.connect("tinker", base_url=server.url, api_key="tml-test", lora_alpha=8), server.stop


def _sagemaker(tmp):
    pytest.importorskip("sagemaker.train.training_session", reason="needs the sagemaker-train SDK")
    from rlkit.backends.sagemaker.emulator import Emulator

    emu = Emulator(state_dir=str(tmp), cadence="fast").start()
    mp = pytest.MonkeyPatch()
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        mp.delenv(key, raising=False)
    for key, value in {**emu.env(), "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-west-2"}.items():
        mp.setenv(key, value)

    def stop():
        emu.stop()
        mp.undo()

    return rlkit.connect("sagemaker"), stop


@pytest.fixture(scope="module", params=["local", "tinker", "sagemaker"])
def backend(request, tmp_path_factory):
    service, stop_server = {"local": _local, "tinker": _tinker, "sagemaker": _sagemaker}[request.param](tmp_path_factory.mktemp(request.param))
    try:
        yield request.param, service
    finally:
        service.close()
        stop_server()


def test_every_backend_refuses_the_same_calls(backend):
    name, service = backend
    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8)
    assert isinstance(trainer, TrainingClient) and trainer.base_model == "tiny"
    batch = [sft_datum(TOKENS, prompt_len=3)]
    refused = [
        (lambda: trainer.forward_backward(batch, "nope"), "unknown loss_fn 'nope'"),
        (lambda: trainer.forward(batch, "ppo", loss_fn_config={"clip_lo": 0.1}), "clip_lo"),
        (lambda: trainer.forward_backward(batch, CrossEntropy(), loss_fn_config={"x": 1.0}),
         "forward_backward: loss_fn_config applies to built-in names only; configure the Loss object"),
        (lambda: trainer.forward_backward(batch, "importance_sampling"), "advantages"),  # a missing input, named
        (lambda: trainer.forward_backward("not a list", CrossEntropy()), "forward_backward: batch must be a list of Datum"),
        (lambda: trainer.forward([{"model_input": 3}], "cross_entropy"), r"forward: batch\[0\]"),
        (lambda: trainer.forward_backward(batch, retrun_logprobs=True), r"unexpected keyword\(s\) \['retrun_logprobs'\]"),
        (lambda: trainer.optim_step(0.1), "optim_step: adam_params: expected AdamParams"),
        (lambda: trainer.optim_step({"learning_rat": 1e-3}), "learning_rat"),
        (lambda: trainer.save_state(3), "save_state: description=3 must be a string"),
        (lambda: trainer.create_sampling_client(7), "create_sampling_client: model_package_arn=7 must be a string"),
        (lambda: service.create_training_client_from_state("ckpt", rnak=4), r"unknown keyword\(s\) \['rnak'\]"),
        (lambda: service.create_training_client_from_state_with_optimizer(None), "model_package_arn=None must be a string"),
        (lambda: service.create_lora_training_client("tiny", rank=0), "rank=0 must be a positive integer"),
        (lambda: service.create_sampling_client(), f"^{NOT_EXACTLY_ONE}$"),
        (lambda: service.create_sampling_client(base_model="tiny", model_package_arn="x"), f"^{NOT_EXACTLY_ONE}$"),
        (lambda: service.create_sampling_client(model_package_arn=7), "^create_sampling_client: model_package_arn=7 must be a string$"),
    ]
    for call, message in refused:
        with pytest.raises(InvalidInputError, match=message):
            call()
    for call in (lambda: trainer.load_state(""), lambda: service.create_training_client_from_state("")):
        with pytest.raises(CheckpointNotFoundError, match="no checkpoint ''"):
            call()
    assert trainer.step == 0
    trainer.stop()
    trainer.stop()  # idempotent
    assert trainer.name not in [s["training_session_name"] for s in service.list_sessions() if s.get("status") == "Running"]
    for call in (lambda: trainer.forward_backward(batch), lambda: trainer.forward(batch, CrossEntropy()), lambda: trainer.optim_step(),
                 lambda: trainer.save_state(), lambda: trainer.save_weights_for_sampler(), lambda: trainer.load_state("x"),
                 lambda: trainer.save_weights_and_get_sampling_client(), lambda: trainer.create_sampling_client()):
        with pytest.raises(ClientStoppedError, match="was stopped; create a new one"):
            call()


def test_every_closed_service_refuses_a_sampling_client_alike(backend):
    """(Runs after the test above on each backend: it closes the module's service.)"""
    _, service = backend
    service.close()
    with pytest.raises(ClientStoppedError, match="^this service client was closed$"):
        service.create_sampling_client(base_model="tiny")
