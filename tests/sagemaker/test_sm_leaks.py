"""SageMaker sessions never leak (issue 15): a create whose answer was lost adopts the session it
made under its own name; a signal during creation stops it (subprocesses); with the emulator's
control-plane faults on, every session a run creates is stopped, whatever the run's outcome."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sm_support import env_for, require_sdk, running_emulator, session_statuses

require_sdk()

from helpers import sft_datum  # noqa: E402

import rlkit  # noqa: E402
from rlkit.errors import RlkitError  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def _wait_for(predicate, timeout=30.0):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("max_sessions", [8, 1])
def test_a_create_whose_answer_was_lost_adopts_its_session(tmp_path, max_sessions):
    """botocore retries the create; the retry meets our own session (``ResourceInUse``), or with a
    quota of one, the quota our own session now fills (``ResourceLimitExceeded``)."""
    with running_emulator(tmp_path, max_sessions=max_sessions, lost_response_ops={"CreateTrainingSession": 1}) as emu:
        with rlkit.connect("sagemaker") as svc:
            trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
            assert emu.state.stats["lost_responses"] == 1 and emu.state.stats["sessions_created"] == 1
            assert emu.state.stats["errors:ResourceInUse" if max_sessions > 1 else "errors:ResourceLimitExceeded"] == 1
            out = trainer.forward_backward([sft_datum([1, 2, 3, 4, 5], prompt_len=1)]).result(timeout=60)
            assert out.metrics["tokens:train"] == 5
        assert session_statuses(emu) == {trainer.name: session_statuses(emu)[trainer.name]}
        assert session_statuses(emu)[trainer.name] in ("Stopping", "Stopped")


def test_a_sampler_and_a_resumed_session_adopt_too(tmp_path):
    with running_emulator(tmp_path) as emu:
        with rlkit.connect("sagemaker") as svc:
            trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
            checkpoint = trainer.save_state("c").result(timeout=60).model_package_arn
            emu.configure(lost_response_ops={"CreateTrainingSession": 2})
            sampler = svc.create_sampling_client(base_model="tiny")
            resumed = svc.create_training_client_from_state_with_optimizer(checkpoint)
            assert sampler.sample([1, 2, 3], sampling_params={"max_tokens": 2, "seed": 1}).result(timeout=60).sequences
            assert resumed.forward([sft_datum([1, 2, 3], prompt_len=1)]).result(timeout=60)
            assert emu.state.stats["sessions_created"] == 3
        assert set(session_statuses(emu).values()) <= {"Stopping", "Stopped"}


SCRIPT = textwrap.dedent("""
    import rlkit
    svc = rlkit.connect("sagemaker")
    print("creating", flush=True)
    svc.create_lora_training_client("tiny", rank=4, alpha=8)
    print("created", flush=True)
""")


@pytest.mark.parametrize("cadence, signum", [("fast", signal.SIGINT), ("sdk", signal.SIGTERM)])
def test_a_signal_during_creation_stops_the_session(tmp_path, cadence, signum):
    """fast: Ctrl-C lands while CreateTrainingSession waits for its answer; sdk: SIGTERM while the
    SDK waits for Running (its 10 s describe loop)."""
    script = tmp_path / "create.py"
    script.write_text(SCRIPT)
    with running_emulator(tmp_path / "emu", cadence=cadence, startup_delay_s=60) as emu:
        env = env_for(emu.url)
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        proc = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout.readline().strip() == "creating"
            _wait_for(
                lambda: (
                    emu.state.sessions
                    and all(s.status in ("Created", "Scheduled") for s in emu.state.sessions.values())
                )
            )
            time.sleep(0.3)  # inside the request (fast) or the SDK's sleep (sdk)
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode in ((130, -signal.SIGINT) if signum == signal.SIGINT else (143,)), err[-2000:]
        assert "created" not in out
        (name,) = emu.state.sessions
        _wait_for(lambda: session_statuses(emu)[name] in ("Stopping", "Stopped"), timeout=10)


def test_control_plane_faults_never_leave_a_session_running(tmp_path):
    """The issue's reproduction (throttling 0.2, 5xx 0.1, lost responses 0.15, control plane
    included), with the first create's answer lost for sure: each SFT run either finishes or fails
    with one line, and every session it created is stopped."""
    from rlkit import cli

    faults = dict(throttle_rate=0.2, error_rate=0.1, lost_response_rate=0.15, control_plane_faults=True, fault_seed=0)
    with running_emulator(tmp_path / "emu", lost_response_ops={"CreateTrainingSession": 1}, **faults) as emu:
        cfg = cli.compose(
            [
                "recipe=sft_gsm8k_smoke",
                "backend=sagemaker",
                "train.steps=2",
                "train.eval_every=0",
                "train.generate.examples=0",
                "logger.console=false",
                "backend.num_threads=null",
            ]
        )
        try:
            cli.execute(cfg, tmp_path / "run")
        except RlkitError as exc:  # a fault past every retry may end the run, with one line
            assert "\n" not in str(exc)
        stats = emu.state.stats
        assert stats["lost_responses"] >= 2 and stats["throttled"] > 0 and stats["server_errors"] > 0
        assert stats["errors:ResourceInUse"] >= 1  # the lost create was retried into our own session, and adopted
        _wait_for(lambda: set(session_statuses(emu).values()) <= {"Stopping", "Stopped"}, timeout=30)
        assert len(session_statuses(emu)) == 1  # one session, not one per retried create
