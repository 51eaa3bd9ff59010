"""What a SageMaker user needs around the loop: ``rlkit sessions`` with only a Region, stopping every
active state, ``cleanup RUN_DIR`` keeping the checkpoints, published weights that do not pile up,
a bill that is read in the background and never fails training, and one clear line for a full
quota, a blocked session and an operation that takes too long."""

import time

import pytest
from sm_support import (
    raw_control_client,
    raw_runtime_client,
    require_sdk,
    running_emulator,
    session_request,
    session_statuses,
)

require_sdk()

from helpers import sft_datum  # noqa: E402

import rlkit  # noqa: E402
from rlkit.backends.sagemaker.cli import sessions_command  # noqa: E402
from rlkit.backends.sagemaker.sampling import OperationTimeoutError, QuotaExceededError, SessionBlockedError  # noqa: E402
from rlkit.errors import InvalidInputError, OperationError  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def _batch(trainer, n=1):
    tok = trainer.get_tokenizer()
    return [sft_datum(tok.encode(t), prompt_len=2) for t in ("one two three four five", "six seven eight nine")[:n]]


def _one_line(exc) -> str:
    text = str(exc)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_sessions_cli_needs_only_a_region_and_stops_every_active_state(tmp_path, capsys, monkeypatch):
    with running_emulator(tmp_path, cadence="sdk", startup_delay_s=60) as emu:
        control, runtime = raw_control_client(emu.url), raw_runtime_client(emu.url)
        control.create_training_session(**session_request("still-created"))  # Created/Scheduled for a minute
        emu.options.startup_delay_s = 0
        for name in ("running-one", "blocked-one", "stopped-one"):
            control.create_training_session(**session_request(name))
        deadline = time.time() + 30
        while {session_statuses(emu)[n] for n in ("running-one", "blocked-one", "stopped-one")} != {"Running"}:
            assert time.time() < deadline
            time.sleep(0.05)
        runtime.execute_training_operation(
            trainingSessionName="blocked-one", sequenceNumber=2, clientToken="b2", operationConfig={"saveState": {}}
        )  # waits for 1: Blocked
        control.stop_training_session(TrainingSessionName="stopped-one")
        monkeypatch.delenv("AWS_REGION")  # only --region (the endpoint is found by its handshake)
        assert sessions_command(["list", "--region", "us-west-2", "--active"]) == 0
        listed = capsys.readouterr().out
        assert all(n in listed for n in ("still-created", "running-one", "blocked-one")) and "stopped-one" not in listed
        assert "Blocked" in listed and ("Created" in listed or "Scheduled" in listed)
        assert sessions_command(["stop", "--all-active", "--region", "us-west-2"]) == 0
        out = capsys.readouterr().out
        assert sorted(line.split()[1] for line in out.splitlines()) == ["blocked-one", "running-one", "still-created"]
        assert all(
            session_statuses(emu)[n] in ("Stopping", "Stopped") for n in ("still-created", "running-one", "blocked-one")
        )


def test_published_weights_do_not_pile_up_and_cleanup_keeps_the_checkpoints(tmp_path, capsys):
    """Each step publishes sampler weights; a superseded, unused package is deleted, and what a
    killed run leaves is removed by ``rlkit sessions cleanup RUN_DIR`` except its checkpoints."""
    with running_emulator(tmp_path / "emu") as emu:
        run = tmp_path / "run"
        run.mkdir()
        (run / "config.yaml").write_text(f"backend:\n  name: sagemaker\n  region: us-west-2\n  endpoint: {emu.url}\n")
        svc = rlkit.connect("sagemaker", checkpoint_dir=str(run / "checkpoints"))
        trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
        batch = _batch(trainer)
        kept = []
        for step in range(3):
            sampler = trainer.save_weights_and_get_sampling_client(f"step {step}")
            sampler.sample([1, 2, 3], sampling_params={"max_tokens": 2, "seed": step}).result(timeout=60)
            trainer.forward_backward(batch).result(timeout=60)  # nothing scored: no package of its own
            trainer.optim_step().result(timeout=60)
            kept.append(trainer.save_state(f"step {step + 1}").result(timeout=60).model_package_arn)
        evaluation = (
            trainer.save_weights_for_sampler("eval").result(timeout=60).model_package_arn
        )  # asked for: kept by the loop
        deadline = time.time() + 10
        while emu.state.summary()["packages"] > 3 + 1 + 1 and time.time() < deadline:
            time.sleep(0.05)
        # 3 checkpoints, the eval weights, and only the newest publish (its sampler is alive)
        assert emu.state.summary()["packages"] == 5 and emu.state.stats["model_packages_registered"] == 7
        (run / "checkpoints.jsonl").write_text(
            "".join(f'{{"step": {i + 1}, "checkpoint": "{a}"}}\n' for i, a in enumerate(kept[:2]))
        )
        del sampler
        svc._finished = True  # the process "dies" here: nothing more is deleted, nothing stopped
        capsys.readouterr()
        # the Region and endpoint come from the run's config.yaml: nothing in the environment
        with pytest.MonkeyPatch.context() as mp:
            for key in ("SAGEMAKER_TRAINING_SESSION_ENDPOINT", "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION"):
                mp.delenv(key, raising=False)
            assert sessions_command(["cleanup", str(run), "--dry-run"]) == 0
            dry = capsys.readouterr().out
            assert emu.state.summary()["packages"] == 4 + 1  # a dry run deletes nothing
            assert sessions_command(["cleanup", str(run)]) == 0
            out = capsys.readouterr().out
        remaining = set(emu.state.packages)
        assert remaining == set(kept[:2]), out  # the checkpoints checkpoints.jsonl keeps, nothing else
        assert f"deleted {evaluation}" in out and f"kept {kept[0]} (checkpoint of step 1)" in out
        # only what existed is reported: the third checkpoint, the eval weights, the newest publish;
        # the two publishes the run pruned itself are counted as gone, not as deleted (dry run too)
        assert sorted(line.split()[-1] for line in dry.splitlines() if line.startswith("would delete")) == sorted(
            line.split()[-1] for line in out.splitlines() if line.startswith("deleted ")) and len(dry.splitlines()) > 3
        assert sum(line.startswith("deleted ") for line in out.splitlines()) == 3, out
        assert "2 more package(s) of the run no longer exist" in out and "3 package(s) deleted" in out, out
        assert sessions_command(["cleanup", str(run)]) == 0  # again: nothing left to delete, and it says so
        again = capsys.readouterr().out
        assert "0 package(s) deleted" in again and "5 more package(s) of the run no longer exist" in again, again
        svc._finished = False
        svc.close()


def test_billing_is_read_in_the_background_and_never_fails_training(tmp_path):
    with running_emulator(tmp_path) as emu:
        with rlkit.connect("sagemaker") as svc:
            trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
            batch = _batch(trainer)
            trainer.forward_backward(batch).result(timeout=60)
            trainer.optim_step().result(timeout=60)
            deadline = time.time() + 10
            while not svc.billing_snapshot(trainer.name):  # read after the step, off the loop's thread
                assert time.time() < deadline
                time.sleep(0.02)
            emu.configure(error_ops={"DescribeTrainingSession": 1000})  # every bill read fails now
            before = emu.state.stats["requests:DescribeTrainingSession"]
            for _ in range(3):
                out = trainer.forward_backward(batch).result(timeout=60)
                trainer.optim_step().result(timeout=60)
            time.sleep(0.5)
            assert out.metrics["billing/training_tokens"] > 0  # the last bill read before the fault
            # at most one read per step, each failing quietly (botocore retries count as requests)
            assert 0 < emu.state.stats["requests:DescribeTrainingSession"] - before <= 3 * 4
            emu.configure(error_ops={})


def test_quota_blocked_and_timeout_are_one_clear_line_each(tmp_path):
    with running_emulator(tmp_path, max_sessions=1, long_poll_s=1.0) as emu:  # a poll holds at most 1 s
        svc = rlkit.connect("sagemaker", operation_timeout_s=3)
        trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
        with pytest.raises(QuotaExceededError) as info:
            svc.create_lora_training_client("tiny", rank=4, alpha=8)
        assert "quota" in _one_line(info.value) and "rlkit sessions stop --all-active" in str(info.value)

        # a submit the service refuses for good leaves a gap: the session blocks behind it
        batch = _batch(trainer, 2)
        trainer.forward(batch).result(timeout=60)
        emu.options.max_request_bytes = 1000  # over this batch, under an optim_step
        fb = trainer.forward_backward(batch * 4)
        opt = trainer.optim_step()
        with pytest.raises(InvalidInputError, match="over the 1000-byte limit"):
            fb.result(timeout=60)
        emu.options.max_request_bytes = None
        with pytest.raises(SessionBlockedError) as info:  # no answer within operation_timeout_s: the session is Blocked
            opt.result(timeout=60)
        assert f"training session {trainer.name} is Blocked" in _one_line(info.value) and "resume" in str(info.value)
        with pytest.raises(
            OperationError, match="cannot run more operations: an earlier operation never reached"
        ) as info:
            trainer.forward(batch)  # the first error, at once
        _one_line(info.value)
        trainer.stop()
        svc.close()

    with running_emulator(tmp_path / "slow") as emu:
        svc = rlkit.connect("sagemaker", operation_timeout_s=1)
        trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
        emu.configure(latency_ms=1500)  # every request now takes longer than the timeout
        with pytest.raises(OperationTimeoutError) as info:
            trainer.optim_step().result(timeout=60)
        assert "no result from SageMaker within 1 s" in _one_line(info.value) and "operation_timeout_s" in str(
            info.value
        )
        emu.configure(latency_ms=0)
        trainer.stop()
        svc.close()
