"""The emulator speaks the service's wire protocol and refuses what the service refuses.

Requests go through plain boto3 clients with client-side validation switched off, so these checks
are the emulator's own: shapes from botocore's service models, AWS's error shape and status codes,
sequence ordering, clientToken idempotency."""

import json
import time
import urllib.error
import urllib.request

import pytest

from sm_support import raw_control_client, raw_runtime_client, require_sdk, running_emulator, session_request, wire_datum

require_sdk()

from botocore.exceptions import ClientError  # noqa: E402


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with running_emulator(tmp_path_factory.mktemp("emulator")) as emu:
        yield emu


@pytest.fixture(scope="module")
def clients(emulator):
    return raw_control_client(emulator.url), raw_runtime_client(emulator.url)


@pytest.fixture(scope="module")
def session(clients):
    control, _ = clients
    control.create_training_session(**session_request("protocol-tests"))
    return "protocol-tests"


def error_of(call):
    with pytest.raises(ClientError) as info:
        call()
    err = info.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"], err["Error"]["Message"]


def wait(runtime, session, op_id, sampling=False):
    get = runtime.get_sampling_operation_result if sampling else runtime.get_training_operation_result
    return get(trainingSessionName=session, operationId=op_id)


def submit(runtime, session, seq, config, token=None):
    kwargs = {"trainingSessionName": session, "sequenceNumber": seq, "operationConfig": config}
    if token:
        kwargs["clientToken"] = token
    return runtime.execute_training_operation(**kwargs)["operationId"]


def test_service_model_validation(clients, session):
    _, runtime = clients
    code, status, message = error_of(lambda: submit(runtime, session, 1, {"forwardBackward": {"lossFnName": "grpo", "datumList": [wire_datum([1, 2, 3])]}}))
    assert (code, status) == ("ValidationException", 400) and "enum value set" in message and "lossFnName" in message
    sample = {"prompt": {"chunks": [{"tokens": [1, 2, 3], "type": "encoded_text"}]}, "numSamples": 1, "samplingParams": {"maxTokens": 16}}
    code, status, message = error_of(lambda: runtime.execute_sampling_operation(trainingSessionName=session, operationConfig={"sample": sample}))
    assert (code, status) == ("ValidationException", 400)
    assert "operationConfig.sample.samplingParams.maxTokens" in message and "greater than or equal to 512" in message
    code, _, message = error_of(lambda: submit(runtime, session, 1, {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.05}}}))
    assert code == "ValidationException" and "less than or equal to 0.01" in message
    code, _, message = error_of(lambda: submit(runtime, session, 1, {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.001}}, "saveState": {}}))
    assert code == "ValidationException" and "exactly one member" in message
    code, status, _ = error_of(lambda: submit(runtime, "no-such-session", 1, {"saveState": {}}))
    assert (code, status) == ("ResourceNotFoundException", 404)


def test_wrong_lengths_fail_the_operation_and_the_session_goes_on(clients, session):
    _, runtime = clients
    short = wire_datum([5, 6, 7, 8], weights=[1.0, 1.0])  # 2 weights for 4 tokens
    op = submit(runtime, session, 1, {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [short]}}, token="len-1")
    result = wait(runtime, session, op)
    assert result["status"] == "Failed" and "datum[0].loss_fn_inputs['weights'] has 2 values for 4 tokens" in result["errorDetails"]
    missing = wire_datum([5, 6, 7, 8])
    op = submit(runtime, session, 2, {"forwardBackward": {"lossFnName": "ppo", "datumList": [missing]}}, token="len-2")
    result = wait(runtime, session, op)
    assert result["status"] == "Failed" and "missing loss_fn_inputs" in result["errorDetails"]
    op = submit(runtime, session, 3, {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [wire_datum([5, 6, 7, 8])]}}, token="len-3")
    result = wait(runtime, session, op)
    assert result["status"] == "Completed" and result["tokenUsage"]["trainingTokens"] == 4
    assert result["operationResult"]["forwardBackward"]["metrics"]["global_token_num"] == 4
    op = submit(runtime, session, 4, {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.001}}}, token="len-4")
    assert wait(runtime, session, op)["status"] == "Completed"


def test_sequence_gap_blocks_and_client_tokens_are_idempotent(clients, emulator):
    control, runtime = clients
    control.create_training_session(**session_request("ordering-tests"))
    name = "ordering-tests"
    fb = {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [wire_datum([9, 10, 11])]}}
    second = submit(runtime, name, 2, {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.001}}}, token="tok-2")
    t0 = time.time()
    emulator.options.long_poll_s = 0.3
    try:
        assert wait(runtime, name, second)["status"] == "Pending"  # waits for sequence number 1
    finally:
        emulator.options.long_poll_s = 20.0
    assert time.time() - t0 >= 0.3
    detail = control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["TrainingSessionStatus"] == "Blocked" and detail["LastReceivedSequenceNumber"] == 2
    first = submit(runtime, name, 1, fb, token="tok-1")
    assert wait(runtime, name, first)["status"] == "Completed"
    assert wait(runtime, name, second)["status"] == "Completed"
    assert control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]["TrainingSessionStatus"] == "Running"
    # the same token again: the same operation, not executed twice
    assert submit(runtime, name, 1, fb, token="tok-1") == first
    code, status, _ = error_of(lambda: submit(runtime, name, 1, fb, token="another-token"))
    assert (code, status) == ("ConflictException", 409)
    code, status, _ = error_of(lambda: submit(runtime, name, 5, fb, token="tok-1"))
    assert (code, status) == ("ConflictException", 409)
    facts = emulator.state.summary()["sessions"][name]
    assert facts["executed_seqs"] == [1, 2]
    assert emulator.state.stats["duplicate_submits"] >= 1


def test_control_plane_errors(clients, session):
    control, _ = clients
    code, status, message = error_of(lambda: control.create_training_session(**session_request("protocol-tests")))
    assert (code, status) == ("ResourceInUse", 400)
    bad_model = session_request("other", ModelConfig={"BaseModelArn": "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/no-such-model/1.0.0"})
    code, _, _ = error_of(lambda: control.create_training_session(**bad_model))
    assert code == "ResourceNotFound"
    code, _, message = error_of(lambda: control.create_training_session(**session_request("bad_name")))
    assert code == "ValidationException" and "TrainingSessionName" in message
    code, _, message = error_of(lambda: control.create_training_session(**session_request("rank", LoraConfig={"Rank": 512, "Alpha": 8})))
    assert code == "ValidationException" and "less than or equal to 256" in message
    code, _, _ = error_of(lambda: control.describe_training_session(TrainingSessionName="missing"))
    assert code == "ResourceNotFound"
    control.create_training_session(**session_request("stop-twice"))
    control.stop_training_session(TrainingSessionName="stop-twice")
    deadline = time.time() + 10
    while control.describe_training_session(TrainingSessionName="stop-twice")["TrainingSessionDetail"]["TrainingSessionStatus"] != "Stopped":
        assert time.time() < deadline
        time.sleep(0.05)
    code, _, message = error_of(lambda: control.stop_training_session(TrainingSessionName="stop-twice"))
    assert code == "ValidationException" and "invalid session state transition from Stopped to " in message
    control.delete_training_session(TrainingSessionName="stop-twice")
    names = [s["TrainingSessionArn"].rsplit("/", 1)[-1] for s in control.list_training_sessions(StatusEquals="Running")["TrainingSessionSummaries"]]
    assert "protocol-tests" in names and "stop-twice" not in names


def test_error_shape_and_authentication_on_the_wire(emulator):
    url = emulator.url + "/"
    body = json.dumps({"TrainingSessionName": "nope"}).encode()
    headers = {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "SageMaker.DescribeTrainingSession"}
    request = urllib.request.Request(url, data=body, headers={**headers, "Authorization": "AWS4-HMAC-SHA256 Credential=test/..."})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request)
    assert info.value.code == 400
    assert json.loads(info.value.read()) == {"__type": "ResourceNotFound", "message": "Training session nope does not exist"}
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers))
    assert info.value.code == 403 and json.loads(info.value.read())["__type"] == "MissingAuthenticationTokenException"
    runtime_url = emulator.url + "/v1/training-sessions/nope/operations/op-1"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(runtime_url, headers={"Authorization": "AWS4-HMAC-SHA256 x"}))
    assert info.value.code == 404 and info.value.headers["x-amzn-ErrorType"] == "ResourceNotFoundException"


def test_chat_passthrough(clients, session):
    _, runtime = clients
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "seed": 1}).encode()
    out = runtime.sample_training_session(trainingSessionName=session, body=body, contentType="application/json")
    reply = json.loads(out["body"].read())
    assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] <= 8
    assert isinstance(reply["choices"][0]["message"]["content"], str)


def test_old_results_are_forgotten_but_client_tokens_are_not(clients, monkeypatch):
    from rlkit.backends.sagemaker.emulator import state

    monkeypatch.setattr(state, "KEPT_OPERATIONS", 2)
    control, runtime = clients
    control.create_training_session(**session_request("pruning-tests"))
    step = {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.001}}}
    ids = []
    for seq in range(1, 5):
        ids.append(submit(runtime, "pruning-tests", seq, step, token=f"prune-{seq}"))
        assert wait(runtime, "pruning-tests", ids[-1])["status"] == "Completed"
    code, status, _ = error_of(lambda: wait(runtime, "pruning-tests", ids[0]))
    assert (code, status) == ("ResourceNotFoundException", 404)
    assert wait(runtime, "pruning-tests", ids[-1])["status"] == "Completed"
    assert submit(runtime, "pruning-tests", 1, step, token="prune-1") == ids[0]  # still not executed twice
