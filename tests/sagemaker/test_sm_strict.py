"""The strict emulator answers what the sagemaker-train SDK documents, and no more.

Raw boto3 clients (no client-side validation) talk to it, so what is checked is the emulator's own
answer: the documented result shapes (throughput metrics + ``actor/*`` mirrors, no per-datum loss
outputs unless the documented ``actor/*`` form is asked for), ``Created -> Scheduled -> Running``,
the warm-up transient, the request-size limit, a sequence gap that times out into ``Failed``, 409
for a session that cannot take requests, and the handshake that identifies the emulator."""

import json
import math
import time
import urllib.request

import pytest
from sm_support import (
    no_retry_runtime_client,
    raw_control_client,
    raw_runtime_client,
    require_sdk,
    running_emulator,
    session_request,
    wire_datum,
)

require_sdk()

from botocore.exceptions import ClientError  # noqa: E402

import rlkit  # noqa: E402
from rlkit.backends.sagemaker import convert  # noqa: E402

THROUGHPUT = {"global_token_num", "estimated_flops", "promised_flops", "mfu"}


def _fb(loss="cross_entropy", datums=None, config=None, kind="forwardBackward"):
    body = {"lossFnName": loss, "datumList": datums or [wire_datum([5, 6, 7, 8, 9]), wire_datum([9, 8, 7])]}
    if config:
        body["lossFnConfig"] = config
    return {kind: body}


def _run(runtime, name, seq, config):
    op = runtime.execute_training_operation(
        trainingSessionName=name, sequenceNumber=seq, clientToken=f"{name}-{seq}", operationConfig=config
    )["operationId"]
    out = runtime.get_training_operation_result(trainingSessionName=name, operationId=op)
    assert out["status"] == "Completed", out
    return out


def _status(control, name):
    return control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]


def _wait_status(control, name, wanted, timeout=20):
    deadline = time.time() + timeout
    while (detail := _status(control, name))["TrainingSessionStatus"] not in wanted:
        assert time.time() < deadline, detail
        time.sleep(0.05)
    return detail


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with running_emulator(tmp_path_factory.mktemp("emulator")) as emu:
        yield emu


def test_results_are_the_documented_shapes_with_the_local_engines_numbers(emulator, tmp_path):
    control, runtime = raw_control_client(emulator.url), raw_runtime_client(emulator.url)
    control.create_training_session(**session_request("shapes"))
    fb = _run(runtime, "shapes", 1, _fb())
    result = fb["operationResult"]["forwardBackward"]
    assert set(result) == {"metrics", "tokenUsage"}  # no lossFnOutputs: no request field asks for them
    assert set(result["metrics"]) == THROUGHPUT | {"actor/pg_loss", "actor/grad_norm"}
    assert (
        result["metrics"]["global_token_num"]
        == 8
        == result["tokenUsage"]["trainingTokens"]
        == fb["tokenUsage"]["trainingTokens"]
    )
    opt = _run(runtime, "shapes", 2, {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.001}}})
    assert opt["operationResult"] == {"optimizerStep": {"metrics": {"actor/lr": 0.001}}}  # no grad_norm here
    forward = _run(runtime, "shapes", 3, _fb(kind="forward"))["operationResult"]["forward"]
    assert set(forward["metrics"]) == THROUGHPUT | {"actor/pg_loss"}  # a forward pass has no gradient
    ppo_datums = [
        wire_datum(
            [5, 6, 7, 8],
            logprobs={"data": [-1.0] * 4, "dtype": "float32"},
            advantages={"data": [0.5] * 4, "dtype": "float32"},
        )
    ]
    ppo = _run(runtime, "shapes", 4, _fb("ppo", ppo_datums, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}))
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm"} <= set(
        ppo["operationResult"]["forwardBackward"]["metrics"]
    )

    # the same numbers as the local engine: pg_loss is the per-datum mean of each datum's loss,
    # grad_norm the norm of the gradient accumulated so far (what optim_step clips)
    local = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path)
    twin = local.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    data = [convert.wire_to_datum(d) for d in _fb()["forwardBackward"]["datumList"]]
    want = twin.forward_backward(data).result()
    grad_norm = twin.optim_step(rlkit.AdamParams(learning_rate=0.001)).result().metrics["grad_norm"]
    assert math.isclose(result["metrics"]["actor/pg_loss"], want.metrics["loss:sum"] / 2, rel_tol=1e-6)
    assert math.isclose(result["metrics"]["actor/grad_norm"], grad_norm, rel_tol=1e-5)
    local.close()


def test_actor_form_of_loss_outputs_is_one_value_per_datum(tmp_path):
    with running_emulator(tmp_path, loss_outputs="actor") as emu:
        control, runtime = raw_control_client(emu.url), raw_runtime_client(emu.url)
        control.create_training_session(**session_request("actor"))
        result = _run(runtime, "actor", 1, _fb(kind="forward"))["operationResult"]["forward"]
        outputs = result["lossFnOutputs"]
        assert len(outputs) == 2 and all(
            set(o) == {"actor/pg_loss"} and len(o["actor/pg_loss"]["data"]) == 1 for o in outputs
        )
        assert math.isclose(
            sum(o["actor/pg_loss"]["data"][0] for o in outputs) / 2, result["metrics"]["actor/pg_loss"], rel_tol=1e-5
        )


def test_created_scheduled_running_then_a_warm_up_transient(tmp_path):
    with running_emulator(tmp_path, cadence="sdk", startup_delay_s=2.0) as emu:  # 1 s per phase: room for a loaded CI
        control, runtime = raw_control_client(emu.url), no_retry_runtime_client(emu.url)
        control.create_training_session(**session_request("warm"))
        # the SDK's cadence: creation answers before the session runs, so the first status read after
        # it is "Created" (a status, not a wall-clock bound: CI machines under load answer slowly)
        seen = [_status(control, "warm")["TrainingSessionStatus"]]
        assert seen[0] == "Created"
        while seen[-1] != "Running":
            time.sleep(0.05)
            seen.append(_status(control, "warm")["TrainingSessionStatus"])
        assert [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]] == ["Created", "Scheduled", "Running"]
        config = {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.001}}}
        with pytest.raises(ClientError) as info:  # the first submit meets the warm-up; the SDK retries it
            runtime.execute_training_operation(
                trainingSessionName="warm", sequenceNumber=1, clientToken="w1", operationConfig=config
            )
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        op = runtime.execute_training_operation(
            trainingSessionName="warm", sequenceNumber=1, clientToken="w1", operationConfig=config
        )
        assert runtime.get_training_operation_result(trainingSessionName="warm", operationId=op["operationId"])[
            "status"
        ] in ("Pending", "InProgress", "Completed")
        assert emu.state.stats["warmup_errors"] == 1


def test_a_request_over_the_size_limit_is_refused(emulator):
    control, runtime = raw_control_client(emulator.url), raw_runtime_client(emulator.url)
    control.create_training_session(**session_request("size"))
    emulator.options.max_request_bytes = 20_000
    try:
        with pytest.raises(ClientError) as info:
            runtime.execute_training_operation(
                trainingSessionName="size",
                sequenceNumber=1,
                clientToken="s1",
                operationConfig=_fb(datums=[wire_datum(list(range(5, 500)))] * 10),
            )
    finally:
        emulator.options.max_request_bytes = None
    err = info.value.response
    assert err["Error"]["Code"] == "ValidationException" and err["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert "over the 20000-byte limit" in err["Error"]["Message"]


def test_a_gap_that_is_never_filled_fails_the_session_and_closed_sessions_answer_409(tmp_path):
    with running_emulator(tmp_path, gap_timeout_s=0.6) as emu:
        control, runtime = raw_control_client(emu.url), raw_runtime_client(emu.url)
        control.create_training_session(**session_request("gap"))
        op = runtime.execute_training_operation(
            trainingSessionName="gap", sequenceNumber=2, clientToken="g2", operationConfig={"saveState": {}}
        )["operationId"]
        blocked = _wait_status(control, "gap", ("Blocked",))
        assert blocked["ErrorDetails"] == "Waiting for the operation with sequence number 1"
        failed = _wait_status(control, "gap", ("Failed",))
        assert "sequence number 1, which never arrived" in failed["ErrorDetails"]
        assert runtime.get_training_operation_result(trainingSessionName="gap", operationId=op)["status"] == "Skipped"
        with pytest.raises(ClientError) as info:
            runtime.execute_training_operation(
                trainingSessionName="gap", sequenceNumber=1, clientToken="g1", operationConfig={"saveState": {}}
            )
        assert (info.value.response["Error"]["Code"], info.value.response["ResponseMetadata"]["HTTPStatusCode"]) == (
            "ConflictException",
            409,
        )


def test_the_health_route_is_the_handshake(emulator):
    with urllib.request.urlopen(emulator.url + "/_emulator/health") as r:
        body = json.loads(r.read())
    assert body == {"ok": True, "emulator": "rlkit-sagemaker-emulator", "strict": True, "cadence": "fast"}
