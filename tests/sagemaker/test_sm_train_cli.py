"""``rlkit train ... backend=sagemaker`` end to end, against ``rlkit emulate sagemaker`` running as a
foreground server in a subprocess (strict answers, fast cadence; tiny model, one engine thread and
every sampling request decoded alone on both sides, so no result depends on arrival timing).

- every loop (SFT, RL, DPO, on- and off-policy distillation, code RL) runs on the strict service,
  which returns no per-token logprobs: the run's metrics say they were scored, and what it cost;

- the RL recipe's metrics equal the local backend's for the same seed, except ``time/*``,
  ``tokens/sampled`` (SageMaker bills up to 512 decoded tokens per sample, see the max_tokens rule)
  and ``train/billing/*`` (SageMaker only);
- with throttling, 5xx errors and lost responses injected, and a session that expires mid-run (the
  run fails with one line; ``rlkit train resume=DIR`` finishes it), the metrics equal an
  uninterrupted run's and each training operation ran exactly once;
- a loop that raises, or is sent SIGTERM, still stops its session; ``rlkit sessions`` lists and
  stops leftovers.
"""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from sm_support import emulator_env, env_for, raw_control_client, require_sdk, session_request
import warm_rlkit

require_sdk()

pytestmark = pytest.mark.slow

HERE = str(Path(__file__).resolve().parent)
ARGS = [
    "recipe=arithmetic_grpo_smoke",
    "+train.task._target_=sm_toy_task.ToyTask", "~train.task.name", "~train.task.ops", "~train.task.num_shots",
    "train.steps=3", "train.checkpoint_every=1", "train.eval_every=0", "train.max_tokens=6",
    "train.learning_rate=0.01", "train.groups_per_batch=2", "train.eval.problems=2", "train.eval.pass_k=0",
    "train.mismatch_every=2",  # mismatch/* on steps 0 and 2: scored there on SageMaker, every step locally (free)
]
# what only the (strict) service reports: its documented metrics, the bill, where logprobs came from
SAGEMAKER_ONLY = ("time/", "train/billing/", "train/actor/", "train/global_token_num", "train/estimated_flops",
                  "train/promised_flops", "train/mfu", "train/logprobs:")
BILLED = ("tokens/sampled",)


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).exists() else []


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """``rlkit emulate sagemaker --port 0`` in the foreground of a subprocess; yields its URL."""
    state = tmp_path_factory.mktemp("emulator")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlkit", "emulate", "sagemaker", "--port", "0", "--num-threads", "1", "--max-batch-rows", "1", "--state-dir", str(state), "--cadence", "fast"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    first = proc.stdout.readline()
    assert "listening on http://" in first, first + proc.stdout.read()
    url = first.strip().rsplit(" ", 1)[-1]
    yield url
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "emulator stopped" in out, out[-2000:]


def helper(url, route, body=None):
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url + route, data=data, method="POST" if data else "GET")) as r:
        return json.loads(r.read())


def rlkit(*args, url=None, cwd, timeout=420):
    env = env_for(url) if url else dict(os.environ)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    return warm_rlkit.run(args, cwd=cwd, env=env, timeout=timeout)


def assert_same_metrics(got, want, *, billed_may_differ=True):
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for g, w in zip(got, want):
        shared = {k for k in w if not k.startswith(SAGEMAKER_ONLY) and not (billed_may_differ and k in BILLED)}
        if g["step"] % 2:  # mismatch steps are 0, 2 (train.mismatch_every=2): where SageMaker scores;
            # in between, of the loss's client-side diagnostics only the service's mirrors are there
            shared = {k for k in shared if not k.startswith(("mismatch/", "train/ppo/"))}
            if "train/grad_norm" in g:
                assert "train/ppo/clip_frac:mean" in g and "train/ppo/kl_sampler_trainer:mean" in g, sorted(g)
        assert shared <= set(g), (g["step"], sorted(shared - set(g)))
        for k in shared:
            # both sides decode every request alone (max_batch_rows=1): which requests shared a decode batch
            # depended on arrival timing (retries, lost responses) and moved fp32 rounding by ~1e-7
            assert math.isclose(g[k], w[k], rel_tol=1e-6, abs_tol=1e-7), (g["step"], k, g[k], w[k])


@pytest.fixture(scope="module")
def reference(emulator, tmp_path_factory):
    """The same recipe on the local backend and on the emulator."""
    tmp = tmp_path_factory.mktemp("reference")
    local = rlkit("train", *ARGS, "backend.max_batch_rows=1", f"run_dir={tmp / 'local'}", cwd=tmp)
    assert local.returncode == 0, local.stderr[-3000:]
    before = helper(emulator, "/_emulator/stats")["stats"]
    sm = rlkit("train", *ARGS, "backend=sagemaker", f"run_dir={tmp / 'sm'}", url=emulator, cwd=tmp)
    assert sm.returncode == 0, sm.stderr[-3000:]
    after = helper(emulator, "/_emulator/stats")
    return {"local": lines(tmp / "local" / "metrics.jsonl"), "sm": lines(tmp / "sm" / "metrics.jsonl"), "dir": tmp / "sm",
            "stats_before": before, "stats_after": after}


def test_sagemaker_run_matches_local_metrics(reference):
    local, sm = reference["local"], reference["sm"]
    assert len(sm) == 4 and any(m.get("train/grad_norm", 0) > 0 for m in sm), "the toy task must produce gradient"
    assert_same_metrics(sm, local)
    for m in sm[:3]:
        # SageMaker decodes (and bills) at least 512 tokens' worth per sample the service did not stop early
        kept = m["rollout/completion_tokens_mean"] * m["rollout/groups"] * 4  # group_size 4
        assert kept <= m["tokens/sampled"] <= 512 * m["rollout/groups"] * 4
        assert m["train/billing/training_tokens"] > 0 and m["train/billing/sample_tokens"] >= m["tokens/sampled"]
        # the strict service returns no per-token logprobs: on mismatch steps (0 and 2) they were
        # scored on the weights the loop published this step (no extra save), one compute_logprobs
        # per distinct datum; on step 1 nothing was scored and no mismatch/* is logged
        assert m["train/logprobs:from_service"] == 0 and m["train/logprobs:scoring_saves"] == 0
        if m["step"] % 2 == 0:
            assert 0 < m["train/logprobs:scored_tokens"] <= m["train/global_token_num"] + m["rollout/groups"] * 4
            assert "mismatch/kl_k3" in m
        else:
            assert m["train/logprobs:scored_tokens"] == 0 and not any(k.startswith("mismatch/") for k in m)
        assert m["train/grad_norm"] == m["train/actor/grad_norm"] > 0
    records = lines(reference["dir"] / "checkpoints.jsonl")
    assert len(records) == 3 and all(r["checkpoint"].startswith("arn:aws:sagemaker:us-west-2:") for r in records)
    sessions = reference["stats_after"]["sessions"]
    assert sessions and all(s["status"] in ("Stopping", "Stopped") for s in sessions.values())


LOOPS = {  # lean smoke runs: one or two steps, little evaluation (the service decodes 512 tokens a sample)
    "sft": ["recipe=sft_gsm8k_smoke", "train.steps=2", "train.eval_every=0", "train.generate.examples=0"],
    "dpo": ["recipe=dpo_gsm8k_smoke", "train.steps=1", "data.train.limit=2", "data.eval.limit=1", "train.generate.examples=0"],
    "onpolicy_distill": ["recipe=prompt_distillation_smoke", "train.steps=1", "train.eval.problems=1"],
    "offpolicy_distill": ["recipe=offpolicy_distill_smoke", "train.teacher.base_model=tiny", "train.steps=1", "train.eval.problems=1"],
    "code_rl": ["recipe=code_grpo_smoke", "train.steps=1", "train.eval.problems=0", "train.eval_every=0", "train.group_size=2"],
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_loop_runs_on_the_strict_service(loop, emulator, tmp_path):
    """In this process (``rlkit train``'s compose + execute), so the five runs share one import of
    the SDK and the engine; the service is the emulator subprocess."""
    from rlkit import cli

    before = set(helper(emulator, "/_emulator/stats")["sessions"])
    with emulator_env(emulator):
        cfg = cli.compose([*LOOPS[loop], "backend=sagemaker", "logger.console=false", "backend.num_threads=null"])
        cli.execute(cfg, tmp_path / "run")
    trained = [m for m in lines(tmp_path / "run" / "metrics.jsonl") if "train/grad_norm" in m]
    assert trained, lines(tmp_path / "run" / "metrics.jsonl")
    if loop != "code_rl":  # the tiny model passes no test: every advantage, and so the gradient, is zero there
        assert all(m["train/grad_norm"] > 0 for m in trained), trained  # the service's actor/grad_norm
    for m in trained:  # the cost of scoring is in the run's metrics: only RL's mismatch step 0 scores a pass
        assert m["train/logprobs:from_service"] == 0
        assert (m["train/logprobs:scored_tokens"] > 0) == (loop == "code_rl"), m
    assert lines(tmp_path / "run" / "checkpoints.jsonl")
    sessions = helper(emulator, "/_emulator/stats")["sessions"]
    new = {name: s["status"] for name, s in sessions.items() if name not in before}
    assert new and set(new.values()) <= {"Stopping", "Stopped"}, new


def test_faults_and_an_expired_session_then_resume_equal_an_uninterrupted_run(emulator, reference, tmp_path):
    """Throttling, 5xx and lost responses throughout; the session expires during step 1 (after its
    checkpoint), the run fails with one line, and ``resume=`` finishes it."""
    run = tmp_path / "run"
    faults = {"throttle_rate": 0.1, "error_rate": 0.05, "lost_response_rate": 0.15, "fault_seed": 1}
    before = helper(emulator, "/_emulator/stats")
    helper(emulator, "/_emulator/config", {**faults, "expire_after_ops": 6})
    try:
        failed = rlkit("train", *ARGS, "backend=sagemaker", f"run_dir={run}", url=emulator, cwd=tmp_path)
        helper(emulator, "/_emulator/config", {"expire_after_ops": None})
        assert failed.returncode == 2, failed.stderr[-3000:]
        assert ("Expired" in failed.stderr or "Stopping" in failed.stderr) and "resume" in failed.stderr
        assert len(lines(run / "checkpoints.jsonl")) == 1
        resumed = rlkit("train", f"resume={run}", url=emulator, cwd=tmp_path)
    finally:
        helper(emulator, "/_emulator/config", {"throttle_rate": 0.0, "error_rate": 0.0, "lost_response_rate": 0.0, "expire_after_ops": None})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_metrics(lines(run / "metrics.jsonl"), reference["sm"], billed_may_differ=False)

    after = helper(emulator, "/_emulator/stats")
    delta = {k: v - before["stats"].get(k, 0) for k, v in after["stats"].items()}
    assert delta["throttled"] > 0 and delta["server_errors"] > 0 and delta["lost_responses"] > 0
    assert delta.get("training_ops_failed", 0) == 0
    new = [s for name, s in after["sessions"].items() if name not in before["sessions"]]
    assert sorted(s["status"] for s in new) == ["Expired", "Stopped"]
    for s in new:  # every operation ran exactly once and none was lost, whatever the retries
        seqs = s["executed_seqs"]
        assert seqs == list(range(1, len(seqs) + 1)) and s["training_ops"] >= len(seqs)
        assert s["status"] == "Expired" or s["training_ops"] == len(seqs)


def test_a_loop_that_raises_stops_its_session(emulator, tmp_path):
    before = set(helper(emulator, "/_emulator/stats")["sessions"])
    out = rlkit("train", *ARGS, "backend=sagemaker", "+train.task.explode=true", "train.rollout.on_failure=fail",
                f"run_dir={tmp_path / 'run'}", url=emulator, cwd=tmp_path)
    assert out.returncode != 0 and "reward exploded" in out.stderr
    sessions = helper(emulator, "/_emulator/stats")["sessions"]
    new = {name: s["status"] for name, s in sessions.items() if name not in before}
    assert new and set(new.values()) <= {"Stopping", "Stopped"}


def test_sigterm_stops_sessions_and_sessions_cli_cleans_up(emulator, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import time, rlkit
        svc = rlkit.connect("sagemaker")
        trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
        print(trainer.name, flush=True)
        try:
            while True:
                time.sleep(0.1)
        finally:
            svc.close()
    """))
    proc = subprocess.Popen([sys.executable, str(script)], env=env_for(emulator), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert helper(emulator, "/_emulator/stats")["sessions"][name]["status"] == "Running"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert helper(emulator, "/_emulator/stats")["sessions"][name]["status"] in ("Stopping", "Stopped")

    # a session leaked by a killed process: rlkit sessions finds and stops it
    raw_control_client(emulator).create_training_session(**session_request("leaked-session"))
    listed = rlkit("sessions", "list", "--status", "Running", url=emulator, cwd=tmp_path, timeout=120)
    assert listed.returncode == 0 and "leaked-session" in listed.stdout and "Running" in listed.stdout, listed.stderr
    stopped = rlkit("sessions", "stop", "leaked-session", url=emulator, cwd=tmp_path, timeout=120)
    assert stopped.returncode == 0 and "stopped leaked-session" in stopped.stdout, stopped.stderr
    deadline = time.time() + 20
    while helper(emulator, "/_emulator/stats")["sessions"]["leaked-session"]["status"] != "Stopped":
        assert time.time() < deadline
        time.sleep(0.1)
