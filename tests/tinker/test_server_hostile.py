"""The Tinker server against hostile clients (raw HTTP where the SDK cannot send the input): every
malformed request is a 4xx before anything is queued, idempotency cannot lie, the helper routes
validate, a finished session creates nothing, and the HTTP layer holds its framing and size limits."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402


def call(server, path, body=None, *, raw=None, headers=None, method="POST"):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "X-API-Key": "tml-test", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def result(server, request_id):
    for _ in range(60):
        status, out = call(server, "/api/v1/retrieve_future", {"request_id": request_id})
        assert status == 200, out
        if out.get("type") != "try_again":
            return out
    raise AssertionError("the future never resolved")


@pytest.fixture(scope="module")
def session_id(tinker_server):
    return call(tinker_server, "/api/v1/create_session", {"tags": []})[1]["session_id"]


@pytest.fixture(scope="module")
def model_id(tinker_server, session_id):
    status, out = call(
        tinker_server,
        "/api/v1/create_model",
        {"session_id": session_id, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 4, "seed": 1}},
    )
    assert status == 200, out
    assert result(tinker_server, out["request_id"])["model_id"] == out["model_id"]
    return out["model_id"]


PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [5, 17, 42]}]}


def test_malformed_requests_are_4xx_before_anything_is_queued(tinker_server, tinker_service, session_id):
    sampler = tinker_service.create_sampling_client(base_model="tiny")
    base = {"base_model": "tiny", "prompt": PROMPT, "sampling_params": {"max_tokens": 2}}
    bad_samples = [
        {"sampling_params": {"max_tokens": 2, "seed": 2**64}},
        {"sampling_params": {"max_tokens": 2, "seed": -1}},
        {"topk_prompt_logprobs": 10**6},
        {"prompt_logprobs_last_n": "x"},
        {"prompt_logprobs": "false"},
        {"num_samples": 10**4},
        {"num_samples": "3"},
        {"sampling_params": {"max_tokens": "5"}},
        {"sampling_params": {"max_tokens": 10**9}},
        {"sampling_params": [1, 2]},
        {"sampling_params": {"max_tokens": 2, "temperature": True}},
        {"prompt": {"chunks": [{"type": "encoded_text", "tokens": ["a"]}]}},
    ]
    before = dict(tinker_server.state.stats)
    for change in bad_samples:
        status, out = call(tinker_server, "/api/v1/asample", {**base, **change})
        assert status == 400, (change, status, out)
        assert "Traceback" not in json.dumps(out)
    assert tinker_server.state.stats["samples_started"] == before.get("samples_started", 0)
    lora = {"rank": 4}
    bad_models = [{"lora_config": {**lora, "train_mlp": "false"}}, {"lora_config": {**lora, "seed": 2**64}},
                  {"lora_config": [1]}, {"base_model": "/etc"}, {"base_model": ["tiny"]}, {"model_seq_id": "1"},
                  {"user_metadata": {"x": "y" * (tinker_server.options.max_metadata_bytes + 1)}}]
    for i, change in enumerate(bad_models):
        body = {"session_id": session_id, "model_seq_id": 100 + i, "base_model": "tiny", "lora_config": lora, **change}
        status, out = call(tinker_server, "/api/v1/create_model", body)
        assert status == 400, (change, status, out)
    etc = {"session_id": session_id, "model_seq_id": 99, "base_model": "/etc", "lora_config": lora}
    assert "'/etc' is not served here" in call(tinker_server, "/api/v1/create_model", etc)[1]["detail"]
    deep = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000
    for raw in (deep, b'{"session_id": 1e400}', b"[1, 2]", b"\xff\xfe", b'{"a": NaN}'):
        status, out = call(tinker_server, "/api/v1/create_session", raw=raw)
        assert status == 400, (raw[:20], status, out)
    fb = {"Content-Type": "application/x-protobuf"}
    status, out = call(tinker_server, "/api/v1/forward_backward", raw=b"\x0a\xff\xff\xff", headers=fb)
    assert status == 400 and "protobuf" in out["detail"], out
    # the server still samples for everyone else
    res = sampler.sample(types.ModelInput.from_ints([5, 17, 42]), 2, types.SamplingParams(max_tokens=3, seed=1)).result()
    assert len(res.sequences) == 2
    tinker_server.options.default_max_tokens = 3  # no max_tokens: the server's default, not the context window
    try:
        res = sampler.sample(types.ModelInput.from_ints([5, 17, 42]), 1, types.SamplingParams(seed=1, stop=[])).result()
    finally:
        tinker_server.options.default_max_tokens = 1024
    assert len(res.sequences[0].tokens) == 3


def test_a_seq_id_reused_with_another_body_is_409_naming_it(tinker_server, model_id):
    first = {"model_id": model_id, "seq_id": 1, "adam_params": {"learning_rate": 1e-4}}
    status, out = call(tinker_server, "/api/v1/optim_step", first)
    assert status == 200, out
    again = call(tinker_server, "/api/v1/optim_step", first)
    assert again == (200, out)  # a resubmission: the first future
    status, conflict = call(tinker_server, "/api/v1/optim_step", {**first, "adam_params": {"learning_rate": 0.5}})
    assert status == 409 and "seq_id 1" in conflict["detail"] and model_id in conflict["detail"]
    result(tinker_server, out["request_id"])


def test_a_refused_training_op_leaves_no_gap_and_non_finite_steps_roll_back(tinker_server, model_id):
    status, out = call(tinker_server, "/api/v1/optim_step",
                       {"model_id": model_id, "seq_id": 2, "adam_params": {"learning_rate": "big"}})
    assert status == 400
    ok = call(tinker_server, "/api/v1/optim_step", {"model_id": model_id, "seq_id": 3, "adam_params": {}})[1]
    assert "metrics" in result(tinker_server, ok["request_id"])  # seq 3 ran: seq 2 was taken, as failed
    huge = call(tinker_server, "/api/v1/optim_step",
                {"model_id": model_id, "seq_id": 4, "adam_params": {"learning_rate": 1e308}})[1]
    out = result(tinker_server, huge["request_id"])
    assert "non-finite" in out.get("error", ""), out
    run = tinker_server.state.run(model_id)
    assert all(bool(p.isfinite().all()) for p in run.trainer._engine.model.parameters() if p.requires_grad)


def test_helper_config_validates_and_finished_sessions_create_nothing(tinker_server, tinker_service):
    before = call(tinker_server, "/_rlkit/config", method="GET")
    for bad in ({"error_rate": "lots"}, {"error_rate": 2}, {"error_rate": 1.5}, {"latency_ms": -1}, {"latency_ms": 60001},
                {"fault_seed": 1.5}, {"fault_seed": "s"}, {"nope": 1}):  # the emulator refuses the same (one check)
        status, _ = call(tinker_server, "/_rlkit/config", bad)
        assert status == 400, bad
    assert call(tinker_server, "/_rlkit/config", method="GET") == before  # nothing changed
    sid = call(tinker_server, "/api/v1/create_session", {})[1]["session_id"]
    assert call(tinker_server, f"/api/v1/sessions/{sid}/finish", {"reason": "weird"})[0] == 200
    status, out = call(tinker_server, "/api/v1/create_model",
                       {"session_id": sid, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": 4}})
    assert status == 410, out
    status, _ = call(tinker_server, "/api/v1/create_sampling_session",
                     {"session_id": sid, "sampling_session_seq_id": 0, "base_model": "tiny"})
    assert status == 410
    assert tinker_server.state.purge(now=time.time() + 10**6) >= 1
    assert sid not in tinker_server.state.sessions


def _raw(server, request: bytes, read_timeout=10.0) -> bytes:
    host, port = server.address
    with socket.create_connection((host, port), timeout=read_timeout) as sock:
        sock.sendall(request)
        chunks = []
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
                if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in b"".join(chunks):
                    break
        except socket.timeout:
            pass
        return b"".join(chunks)


def test_http_framing_size_limits_idle_timeout_and_quiet_disconnects(tinker_server, capfd):
    import zstandard

    head = "POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: tml-test\r\nContent-Type: application/json\r\n"
    for length in ("abc", "-1", "1e3"):
        answer = _raw(tinker_server, f"{head}Content-Length: {length}\r\n\r\n{{}}".encode())
        assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
    chunked = _raw(tinker_server, f"{head}Transfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n".encode())
    assert chunked.startswith(b"HTTP/1.1 200"), chunked[:80]
    limit = tinker_server.options.max_body_bytes
    tinker_server.options.max_body_bytes = 1 << 20
    try:
        t0 = time.time()  # 100 MiB declared, never sent: refused from the header alone
        big = _raw(tinker_server, f"{head}Content-Length: {100 << 20}\r\n\r\n".encode())
        assert big.startswith(b"HTTP/1.1 413") and time.time() - t0 < 5
        over = _raw(tinker_server, f"{head}Transfer-Encoding: chunked\r\n\r\n".encode() + b"100000\r\n" + b"x" * (1 << 20) + b"\r\n100\r\n")
        assert over.startswith(b"HTTP/1.1 413"), over[:80]
        bomb = zstandard.ZstdCompressor().compress(b"{" + b" " * (64 << 20) + b"}")
        assert len(bomb) < 10_000
        status, out = call(tinker_server, "/api/v1/create_session", raw=bomb, headers={"Content-Encoding": "zstd"})
        assert status == 413, out
    finally:
        tinker_server.options.max_body_bytes = limit
    tinker_server.idle_timeout_s = 0.5
    try:
        host, port = tinker_server.address
        with socket.create_connection((host, port), timeout=10) as idle:
            t0 = time.time()
            assert idle.recv(10) == b""  # the server closed the silent connection
            assert time.time() - t0 < 5
    finally:
        tinker_server.idle_timeout_s = 60.0
    for _ in range(5):  # clients that vanish mid-body
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(f"{head}Content-Length: 100\r\n\r\n{{".encode())
    time.sleep(0.5)
    assert call(tinker_server, "/api/v1/healthz", method="GET")[0] == 200
    assert "Traceback" not in capfd.readouterr().err
