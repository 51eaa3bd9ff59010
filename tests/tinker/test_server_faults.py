"""Injected faults (429s, 500s, responses lost after processing) with the real SDK: nothing lost,
nothing executed twice, and the results equal a run without faults. Plus auth and loopback."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from rlkit.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

TOKENS = [5, 17, 42, 99, 7, 250, 31, 64, 12, 300, 8]


def run_steps(service, steps=4):
    """A fixed little loop: its losses, sampled tokens and the run's id."""
    trainer = service.create_lora_training_client(base_model="tiny", rank=4, seed=7).result()
    batch = [
        types.Datum(
            model_input=types.ModelInput.from_ints(TOKENS[i:-1]),
            loss_fn_inputs={"target_tokens": TOKENS[i + 1 :], "weights": [1.0] * (len(TOKENS) - 1 - i)},
        )
        for i in range(3)
    ]
    losses, samples = [], []
    for _ in range(steps):
        fb = trainer.forward_backward(batch, "cross_entropy")
        opt = trainer.optim_step(types.AdamParams(learning_rate=2e-2))
        losses.append(fb.result().metrics["loss:sum"])
        opt.result()
        sampler = trainer.save_weights_and_get_sampling_client().result()
        res = sampler.sample(
            types.ModelInput.from_ints(TOKENS[:4]), 2, types.SamplingParams(max_tokens=4, seed=11)
        ).result()
        samples.append([s.tokens for s in res.sequences])
    path = trainer.save_state("final").result().path
    return losses, samples, trainer.model_id, path


def test_faults_lose_and_duplicate_nothing(tinker_server, tinker_service):
    clean_losses, clean_samples, _, _ = run_steps(tinker_service)
    tinker_server.configure(throttle_rate=0.05, error_rate=0.1, lost_response_rate=0.25, fault_seed=3)
    try:
        losses, samples, model_id, path = run_steps(tinker_service)
    finally:
        tinker_server.configure(throttle_rate=0.0, error_rate=0.0, lost_response_rate=0.0)
    stats = tinker_server.state.summary()
    assert stats["stats"]["lost_responses"] > 0 and stats["stats"]["server_errors"] > 0
    assert stats["stats"]["duplicate_submits"] > 0  # resubmissions were recognised, not rerun
    executed = stats["runs"][model_id]["executed_seqs"]
    assert executed == list(range(1, len(executed) + 1))  # every op once, in order
    assert (
        len(executed) == 4 * 4 + 1
    )  # per step: forward_backward (2 chunks of <= 2 datums), optim_step, sampler weights; save_state
    assert losses == pytest.approx(clean_losses, rel=1e-6)
    assert samples == clean_samples
    assert path.endswith("/weights/final")


def test_auth_beyond_loopback_and_wrong_keys(tmp_path):
    from rlkit.backends.tinker.server import TinkerServer

    with pytest.raises(ConfigError, match="beyond loopback needs an API key"):
        TinkerServer(state_dir=str(tmp_path / "a")).bind("0.0.0.0", 0)
    with pytest.raises(ConfigError, match="start with 'tml-'"):
        TinkerServer(api_key="secret")
    with TinkerServer(state_dir=str(tmp_path / "b"), api_key="tml-right").start() as server:
        req = urllib.request.Request(
            f"{server.url}/api/v1/create_session",
            data=b"{}",
            method="POST",
            headers={"Content-Type": "application/json", "X-API-Key": "tml-wrong"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 401 and "API key" in json.loads(err.value.read())["detail"]
        service = tinker.ServiceClient(base_url=server.url, api_key="tml-right")
        sampler = service.create_sampling_client(base_model="tiny").result()
        assert (
            len(
                sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2))
                .result()
                .sequences
            )
            == 1
        )
        service.close("success").result()
        with pytest.raises(tinker.AuthenticationError):
            tinker.ServiceClient(base_url=server.url, api_key="tml-wrong").create_sampling_client(
                base_model="tiny"
            ).result()


def test_a_session_without_heartbeats_is_finished_and_its_runs_released(tmp_path):
    from rlkit.backends.tinker.server import TinkerServer

    def post(url, route, body):
        req = urllib.request.Request(
            url + route, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    with TinkerServer(state_dir=str(tmp_path), session_timeout_s=1.0).start() as server:
        sid = post(server.url, "/api/v1/create_session", {"tags": [], "user_metadata": {}, "sdk_version": "test"})[
            "session_id"
        ]
        post(
            server.url,
            "/api/v1/create_model",
            {"session_id": sid, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 2}},
        )
        run = server.state.runs[f"{sid}:train:0"]
        deadline = time.time() + 20
        while server.state.sessions[sid].finished is None and time.time() < deadline:
            time.sleep(0.2)
        assert server.state.sessions[sid].finished == "expired" and server.state.stats["sessions_expired"] == 1
        assert run.trainer._stopped  # the engine's training client was stopped
        with pytest.raises(urllib.error.HTTPError) as err:
            post(server.url, "/api/v1/session_heartbeat", {"session_id": sid})
        assert err.value.code == 410  # the SDK stops its heartbeat loop on 410
