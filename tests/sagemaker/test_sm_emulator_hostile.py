"""The emulator against hostile clients: malformed sampling and chat requests are 4xx before any
decode (another client's sample is unaffected), a clientToken reused with another operation is a
409, the fault-injection route validates, the HTTP layer refuses bad framing and oversized bodies
before reading them, and the emulator will not listen beyond loopback without a key."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from sm_support import raw_control_client, raw_runtime_client, require_sdk, running_emulator, session_request, wire_datum

require_sdk()
from botocore.exceptions import ClientError  # noqa: E402

AUTH = {"Authorization": "AWS4-HMAC-SHA256 Credential=test/20250101/us-west-2/sagemaker/aws4_request, Signature=x"}
PROMPT = {"chunks": [{"tokens": [5, 6, 7], "type": "encoded_text"}]}


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    with running_emulator(tmp_path_factory.mktemp("hostile"), warmup_errors=0) as emulator:
        raw_control_client(emulator.url).create_training_session(**session_request("hostile"))
        yield emulator


def post(emu, path, raw, headers=None):
    req = urllib.request.Request(emu.url + path, data=raw, method="POST", headers={**AUTH, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def sample_config(**change):
    cfg = {"prompt": PROMPT, "numSamples": 1, "samplingParams": {"maxTokens": 512, "seed": 1}}
    cfg.update(change)
    return {"sample": cfg}


def test_malformed_samples_and_chats_are_4xx_and_others_still_sample(emu):
    runtime = raw_runtime_client(emu.url)
    bad = [
        sample_config(samplingParams={"maxTokens": 512, "seed": 2**64}),
        sample_config(topkPromptLogprobs=10**6),
        sample_config(numSamples=10**4),
    ]
    for cfg in bad:
        with pytest.raises(ClientError) as info:
            runtime.execute_sampling_operation(trainingSessionName="hostile", operationConfig=cfg)
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400, cfg
    assert emu.state.stats["sampling_ops_received"] == 0  # nothing reached the sampler
    chat = "/training-sessions/hostile/sample"
    for body in ({"messages": [{"role": "user", "content": "hi"}], "n": 512, "max_tokens": 2000},
                 {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9},
                 {"messages": [{"role": "user", "content": "hi"}], "seed": 2**64},
                 {"messages": {"role": "user"}}, [1, 2]):
        status, out = post(emu, chat, json.dumps(body).encode(), {"Content-Type": "application/json"})
        assert status == 400, (body, out)
    deep = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000
    for path in (chat, "/v1/training-sessions/hostile/sampling-operations"):
        for raw in (deep, b'{"x": 1e400}'):
            status, out = post(emu, path, raw, {"Content-Type": "application/json"})
            assert status == 400 and "Traceback" not in json.dumps(out), (path, raw[:12], status, out)
    ok = runtime.execute_sampling_operation(trainingSessionName="hostile", operationConfig=sample_config())
    result = runtime.get_sampling_operation_result(trainingSessionName="hostile", operationId=ok["operationId"])
    assert result["status"] == "Completed", result


def test_a_client_token_reused_with_another_operation_is_409(emu):
    runtime = raw_runtime_client(emu.url)
    fb = {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [wire_datum([5, 6, 7, 8])]}}
    first = runtime.execute_training_operation(trainingSessionName="hostile", sequenceNumber=1, clientToken="t1",
                                               operationConfig=fb)
    again = runtime.execute_training_operation(trainingSessionName="hostile", sequenceNumber=1, clientToken="t1",
                                               operationConfig=fb)
    assert again["operationId"] == first["operationId"]
    other = {"forwardBackward": {**fb["forwardBackward"], "datumList": [wire_datum([9, 10, 11])]}}
    with pytest.raises(ClientError) as info:
        runtime.execute_training_operation(trainingSessionName="hostile", sequenceNumber=1, clientToken="t1",
                                           operationConfig=other)
    err = info.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 409 and "clientToken t1" in err["Error"]["Message"]


def test_fault_config_validates_and_http_framing_holds(emu):
    before = dict(vars(emu.options))
    for bad in ({"error_rate": "lots"}, {"error_rate": 1.5}, {"latency_ms": -5}, {"latency_ms": 60001}, {"error_ops": {"X": "many"}},
                {"fault_seed": "s"}, {"fault_seed": 1.5}, {"nope": 1}):  # the Tinker server refuses the same (one check)
        status, _ = post(emu, "/_emulator/config", json.dumps(bad).encode())
        assert status == 400, bad
    assert dict(vars(emu.options)) == before
    host, port = emu.address
    head = f"POST /v1/training-sessions/hostile/sampling-operations HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH['Authorization']}\r\n"
    for length in ("abc", "-1"):
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(f"{head}Content-Length: {length}\r\n\r\n{{}}".encode())
            assert s.recv(200).startswith(b"HTTP/1.1 400")
    with socket.create_connection((host, port), timeout=10) as s:  # 100 MiB declared: 413 before a byte is read
        s.sendall(f"{head}Content-Length: {100 << 20}\r\n\r\n".encode())
        assert s.recv(200).startswith(b"HTTP/1.1 413")


def test_the_emulator_listens_beyond_loopback_only_with_a_flag_and_a_key(tmp_path):
    from rlkit.backends.sagemaker.emulator import Emulator
    from rlkit.errors import ConfigError

    with pytest.raises(ConfigError, match="allow-remote"):
        Emulator(state_dir=str(tmp_path / "a")).bind("0.0.0.0", 0)
    with pytest.raises(ConfigError, match="access-key-id"):
        Emulator(state_dir=str(tmp_path / "b"), allow_remote=True).bind("0.0.0.0", 0)
    with running_emulator(tmp_path / "c", access_key_id="AKIDRIGHT") as keyed:
        status, out = post(keyed, "/v1/training-sessions/x/sampling-operations", b"{}")
        assert status == 403, out
        right = {"Authorization": AUTH["Authorization"].replace("test/", "AKIDRIGHT/")}
        assert post(keyed, "/v1/training-sessions/x/sampling-operations", b"{}", right)[0] in (400, 404)


def test_rlkit_emulate_beyond_loopback_without_a_key_is_one_line_and_exit_2():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "from rlkit.cli import main; raise SystemExit(main())", "emulate",
                          "sagemaker", "--host", "0.0.0.0", "--port", "0", "--allow-remote"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs --access-key-id" in out.stderr and "Traceback" not in out.stderr
