"""The Tinker server's sessions own their work: a small sample answers while another client's large
one runs (continuous batching), work whose session finished, whose client cancelled it or whose
deadline passed is cancelled with a one-line error, every future resolves even when building its
answer fails, and with several API keys each key's sessions, runs, futures and checkpoints are
404 to the others."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [5, 17, 42]}]}


def call(server, path, body=None, *, key="tml-test", method="POST"):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", "X-API-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            if "protobuf" in resp.headers.get("Content-Type", ""):
                return resp.status, {"protobuf": raw}
            return resp.status, json.loads(raw or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def result(server, request_id, key="tml-test"):
    for _ in range(60):
        status, out = call(server, "/api/v1/retrieve_future", {"request_id": request_id}, key=key)
        assert status == 200, out
        if out.get("type") != "try_again":
            return out
    raise AssertionError("the future never resolved")


def big_sample(server, session=None, key="tml-test"):
    """A sample at the server's num_samples cap that would decode for about a minute."""
    body = {"prompt": PROMPT, "num_samples": server.options.max_num_samples,
            "sampling_params": {"max_tokens": 2000, "seed": 1, "stop": []}}
    body.update({"sampling_session_id": session} if session else {"base_model": "tiny"})
    status, out = call(server, "/api/v1/asample", body, key=key)
    assert status == 200, out
    return out["request_id"]


def wait_running(server, n=1):
    for _ in range(200):
        if server.state.inflight.count() >= n:
            return
        time.sleep(0.02)
    raise AssertionError("the sample never started")


def test_a_small_sample_answers_while_a_large_one_runs_and_a_finished_session_cancels_its_work(tinker_server, tinker_service):
    server = tinker_server
    sid = call(server, "/api/v1/create_session", {})[1]["session_id"]
    out = call(server, "/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 4}})[1]
    model_id = result(server, out["request_id"])["model_id"]
    sampler = call(server, "/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0, "base_model": "tiny"})[1]
    big = big_sample(server, sampler["sampling_session_id"])
    wait_running(server)
    other = tinker_service.create_sampling_client(base_model="tiny")  # another client, another session
    t0 = time.time()
    res = other.sample(types.ModelInput.from_ints([5, 17, 42]), 1, types.SamplingParams(max_tokens=4, seed=1)).result()
    assert len(res.sequences[0].tokens) == 4 and time.time() - t0 < 5  # it joined the running decode
    assert not server.state.future(big).done.is_set()  # the large one is still decoding
    run = server.state.run(model_id)  # a slow operation running, one queued behind it, one waiting for a gap
    running = run.submit(1, lambda: time.sleep(2.0) or {"ok": True})
    queued = call(server, "/api/v1/optim_step", {"model_id": model_id, "seq_id": 2, "adam_params": {}})[1]["request_id"]
    waiting = call(server, "/api/v1/optim_step", {"model_id": model_id, "seq_id": 9, "adam_params": {}})[1]["request_id"]
    time.sleep(0.2)
    t0 = time.time()
    assert call(server, f"/api/v1/sessions/{sid}/finish", {"reason": "success"})[0] == 200
    assert not server.state.future(running).done.is_set()  # finishing never waits for the running operation
    out = result(server, big)
    assert "cancelled" in out["error"] and sid in out["error"] and "\n" not in out["error"], out
    assert time.time() - t0 < 5  # the decode stopped at its next step
    assert result(server, running) == {"ok": True}  # the running operation finished
    for rid in (queued, waiting):
        out = result(server, rid)
        assert "cancelled before it ran" in out["error"] and "finished" in out["error"], out
    for _ in range(100):
        if run.ended:
            break
        time.sleep(0.05)
    assert run.ended and server.state.inflight.count() == 0  # the engine's client released, nothing left running
    status, _ = call(server, "/api/v1/optim_step", {"model_id": model_id, "seq_id": 3, "adam_params": {}})
    assert status == 410


def test_a_sample_past_its_deadline_or_cancelled_by_its_client_fails_in_one_line(tinker_server, tinker_service):
    server = tinker_server
    server.options.request_deadline_s = 1.0
    try:
        rid = big_sample(server)
        t0 = time.time()
        out = result(server, rid)
    finally:
        server.options.request_deadline_s = 900.0
    assert "request deadline of 1 s" in out["error"] and "\n" not in out["error"], out
    assert time.time() - t0 < 4
    rid = big_sample(server)
    wait_running(server)
    assert call(server, "/api/v1/client/dynamic_config", {})[1]["sample_cancel_enabled"] is True  # the SDK sends cancel_future
    assert call(server, "/api/v1/cancel_future", {"request_id": rid}) == (200, {})
    out = result(server, rid)
    assert out["error"] == "sample: cancelled by its client (cancel_future)", out
    for _ in range(100):
        if server.state.inflight.count() == 0:
            break
        time.sleep(0.05)
    assert server.state.inflight.count() == 0
    # the real SDK: cancelling a sample's future sends cancel_future, and the decode stops
    client = tinker_service.create_sampling_client(base_model="tiny")
    future = client.sample(types.ModelInput.from_ints([5, 17, 42]), server.options.max_num_samples,
                           types.SamplingParams(max_tokens=2000, seed=2, stop=[]))
    wait_running(server)
    time.sleep(0.3)  # the SDK knows the request id once asample answered; before that it cannot cancel
    cancelled = server.state.stats["samples_cancelled"]
    future.cancel()
    for _ in range(100):
        if server.state.inflight.count() == 0:
            break
        time.sleep(0.05)
    assert server.state.inflight.count() == 0 and server.state.stats["samples_cancelled"] == cancelled + 1


def test_every_future_resolves_when_building_its_answer_fails(tinker_server, monkeypatch):
    from rlkit.backends.tinker.server import ops

    def broken(*args, **kwargs):
        raise RuntimeError("cannot build the answer")

    monkeypatch.setattr(ops.wire, "sample_response", broken)
    status, out = call(tinker_server, "/api/v1/asample", {"base_model": "tiny", "prompt": PROMPT, "sampling_params": {"max_tokens": 2}})
    assert status == 200
    out = result(tinker_server, out["request_id"])
    assert out["category"] == "server" and "cannot build the answer" in out["error"], out
    monkeypatch.undo()
    sid = call(tinker_server, "/api/v1/create_session", {})[1]["session_id"]
    out = call(tinker_server, "/api/v1/create_model",
               {"session_id": sid, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 4}})[1]
    run = tinker_server.state.run(result(tinker_server, out["request_id"])["model_id"])

    class Escaped(BaseException):  # not an Exception: it used to end the run's worker, its future unresolved
        pass

    def escape():
        raise Escaped("out of the op")

    out = result(tinker_server, run.submit(1, escape))
    assert out["category"] == "server" and "Escaped: out of the op" in out["error"], out
    step = call(tinker_server, "/api/v1/optim_step", {"model_id": run.model_id, "seq_id": 2, "adam_params": {}})[1]
    assert "metrics" in result(tinker_server, step["request_id"])  # the worker still serves the run
    call(tinker_server, f"/api/v1/sessions/{sid}/finish", {})


def test_each_api_key_owns_what_it_creates(tmp_path):
    from rlkit.backends.tinker.server import TinkerServer

    with TinkerServer(state_dir=str(tmp_path), api_key="tml-alice", api_keys=("tml-bob",)).start() as server:
        alice = lambda path, body=None, method="POST": call(server, path, body, key="tml-alice", method=method)  # noqa: E731
        bob = lambda path, body=None, method="POST": call(server, path, body, key="tml-bob", method=method)  # noqa: E731
        assert call(server, "/api/v1/create_session", {}, key="tml-mallory")[0] == 401
        sid = alice("/api/v1/create_session", {})[1]["session_id"]
        out = alice("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 4}})[1]
        model_id = result(server, out["request_id"], "tml-alice")["model_id"]
        saved = alice("/api/v1/save_weights_for_sampler", {"model_id": model_id, "seq_id": 1, "path": "s1"})[1]
        path = result(server, saved["request_id"], "tml-alice")["path"]
        sample = alice("/api/v1/asample", {"model_path": path, "prompt": PROMPT, "sampling_params": {"max_tokens": 2}})[1]
        assert "protobuf" in result(server, sample["request_id"], "tml-alice")  # a SampleResponse
        # to bob, alice's things are exactly like things that never existed
        assert bob("/api/v1/retrieve_future", {"request_id": sample["request_id"]})[0] == 404
        missing = bob("/api/v1/retrieve_future", {"request_id": "req-nope"})
        theirs = bob("/api/v1/retrieve_future", {"request_id": sample["request_id"]})
        assert theirs[1]["detail"].replace(sample["request_id"], "X") == missing[1]["detail"].replace("req-nope", "X")
        refused = [
            bob("/api/v1/optim_step", {"model_id": model_id, "seq_id": 2, "adam_params": {}}),
            bob("/api/v1/get_info", {"model_id": model_id}),
            bob(f"/api/v1/training_runs/{model_id}", method="GET"),
            bob(f"/api/v1/sessions/{sid}", method="GET"),
            bob("/api/v1/session_heartbeat", {"session_id": sid}),
            bob(f"/api/v1/sessions/{sid}/finish", {}),
            bob("/api/v1/create_model", {"session_id": sid, "model_seq_id": 1, "base_model": "tiny", "lora_config": {"rank": 4}}),
            bob("/api/v1/asample", {"model_path": path, "prompt": PROMPT, "sampling_params": {"max_tokens": 2}}),
            bob("/api/v1/weights_info", {"tinker_path": path}),
            bob(f"/api/v1/training_runs/{model_id}/checkpoints/sampler_weights/s1", method="DELETE"),
        ]
        assert [status for status, _ in refused] == [404] * len(refused), refused
        assert sid not in json.dumps(bob("/api/v1/sessions", method="GET")[1])
        assert bob("/api/v1/training_runs", method="GET")[1]["training_runs"] == []
        assert bob("/api/v1/checkpoints", method="GET")[1]["checkpoints"] == []
        bob_sid = bob("/api/v1/create_session", {})[1]["session_id"]
        out = bob("/api/v1/load_weights", {"session_id": bob_sid, "model_seq_id": 0, "path": path})
        assert out[0] == 404, out
        # alice still sees everything of hers
        assert [c["tinker_path"] for c in alice("/api/v1/checkpoints", method="GET")[1]["checkpoints"]] == [path]
        assert alice(f"/api/v1/training_runs/{model_id}", method="GET")[0] == 200
        assert sid in alice("/api/v1/sessions", method="GET")[1]["sessions"]
