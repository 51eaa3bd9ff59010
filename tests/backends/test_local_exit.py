"""Clean exits: a process that used the local backend exits with its own code (0, 1, 130), never
with the SIGABRT of a worker thread still inside torch at interpreter shutdown ("terminate called
without an active exception", exit 134). Every case runs in fresh subprocesses, several times."""

import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlkit.types import SamplingParams

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

TESTS = str(Path(__file__).resolve().parents[1])
REPEAT = 3
ABORT_SIGNS = ("terminate called", "FATAL: exception not rethrown", "Fatal Python error")

# The README's loop shape on the tiny model; the script ends with work it never waited for.
SCRIPT = textwrap.dedent(
    """
    import sys
    import rlkit
    from helpers import sft_datum

    mode, out = sys.argv[1], sys.argv[2]
    service = rlkit.connect("local", checkpoint_dir=out, num_threads=1)
    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    batch = [sft_datum(list(range(1, 60)), 3) for _ in range(8)]
    for step in range(3):
        fwd_bwd = trainer.forward_backward(batch, loss_fn="cross_entropy")
        optim = trainer.optim_step(rlkit.AdamParams(learning_rate=1e-3))
        print(fwd_bwd.result().metrics["loss:sum"], flush=True)
    sampler = trainer.save_weights_and_get_sampling_client()
    sampler.sample([1, 2, 3], num_samples=4, sampling_params=rlkit.SamplingParams(max_tokens=400))  # never awaited
    if mode == "normal":
        for _ in range(3):
            trainer.forward_backward(batch)
            trainer.optim_step()
        trainer.save_state(name="final")  # queued, never awaited: a normal exit still writes it
    elif mode == "crash":
        for _ in range(60):
            trainer.forward_backward(batch)
            trainer.optim_step()
        trainer.save_state(name="never")  # 120 operations behind: cancelled by the crash
        raise RuntimeError("a bug in the user's loop")
    """
)


def run_script(tmp_path, mode, rep):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    out = tmp_path / f"ckpt-{mode}-{rep}"
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(out)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return proc, out


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


def no_abort(stderr):
    return not any(sign in stderr for sign in ABORT_SIGNS)


def checkpoints(root):
    return sorted(p.name for p in root.glob("*/*") if p.is_dir() and not p.name.startswith("."))


def test_readme_loop_ending_with_unawaited_work_exits_0(tmp_path):
    for rep in range(REPEAT):
        proc, out = run_script(tmp_path, "normal", rep)
        assert proc.returncode == 0 and no_abort(proc.stderr), (proc.returncode, proc.stderr[-2000:])
        assert len(proc.stdout.split()) == 3
        assert checkpoints(out) == ["final"]  # the queued save_state was drained, not dropped


def test_uncaught_exception_with_work_in_flight_exits_1(tmp_path):
    for rep in range(REPEAT):
        proc, out = run_script(tmp_path, "crash", rep)
        assert proc.returncode == 1 and no_abort(proc.stderr), (proc.returncode, proc.stderr[-2000:])
        assert "RuntimeError: a bug in the user's loop" in proc.stderr
        assert checkpoints(out) == []  # queued work was cancelled, not run to the end


TRAIN = [
    "recipe=sft_gsm8k_smoke",
    "backend.num_threads=1",
    "data.train.limit=200",
    "train.steps=400",
    "train.checkpoint_every=3",
    "train.eval_every=5",
]


@pytest.mark.parametrize("gap", [0.0, 0.3])
def test_double_ctrl_c_in_rlkit_train_exits_130(tmp_path, gap):
    for i in range(2):
        run = tmp_path / f"run{i}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlkit", "train", *TRAIN, f"run_dir={run}"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 90
        metrics = run / "metrics.jsonl"
        while time.time() < deadline and proc.poll() is None and len(lines(metrics)) < 2:
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before the interrupt: " + proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        time.sleep(gap)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 130 and no_abort(err), (gap, proc.returncode, err[-2000:])
        assert "Traceback" not in err and err.strip().splitlines()[-1] == "rlkit: error: interrupted", err[-2000:]
        assert len(lines(run / "metrics.jsonl")) < 400  # it stopped early


# -- cancelling (in process) ---------------------------------------------------------------------------


def test_cancelled_queued_operation_never_runs():
    from rlkit.backends.local.workers import OrderedWorker

    worker = OrderedWorker("test-worker")
    gate, ran = __import__("threading").Event(), []
    first = worker.submit(lambda: gate.wait(30) and ran.append("first"), operation="first")
    queued = [worker.submit(lambda i=i: ran.append(i), operation=f"op{i}") for i in range(4)]
    assert queued[1].cancel() and queued[2].cancel()
    assert not first.cancel() or True  # first may already be running; either way it finishes
    gate.set()
    worker.close(wait=True)
    assert [f.cancelled() for f in queued] == [False, True, True, False]
    with pytest.raises(concurrent.futures.CancelledError):
        queued[1].result()
    assert ran[-2:] == [0, 3]  # in order, the cancelled ones skipped


def test_close_with_cancel_runs_only_the_running_operation():
    import threading

    from rlkit.backends.local.workers import OrderedWorker

    worker = OrderedWorker("test-worker")
    started, gate, ran = threading.Event(), threading.Event(), []
    running = worker.submit(lambda: (started.set(), gate.wait(30), ran.append("running")), operation="running")
    queued = [worker.submit(lambda i=i: ran.append(i), operation=f"op{i}") for i in range(3)]
    started.wait(30)
    closer = threading.Thread(target=worker.close, kwargs={"wait": True, "cancel": True})
    closer.start()
    gate.set()
    closer.join(30)
    assert running.done() and ran == ["running"]
    assert all(f.cancelled() for f in queued)


def test_cancelling_a_running_sample_stops_it_at_the_next_decode_step(service):
    sampler = service.create_sampling_client(base_model="tiny")
    seen = []
    holder = {}

    def on_token(index, token):
        seen.append(token)
        if len(seen) == 3:
            holder["future"].cancel()

    params = SamplingParams(max_tokens=300, temperature=1.0, seed=0)
    holder["future"] = future = sampler.sample([1, 2, 3], sampling_params=params, on_token=on_token)
    with pytest.raises(concurrent.futures.CancelledError):
        future.result(timeout=60)
    assert len(seen) == 3  # cancelled after token 3: no fourth decode step
    after = sampler.sample([1, 2, 3], sampling_params=SamplingParams(max_tokens=5, temperature=0.0)).result(timeout=60)
    assert len(after.sequences[0].tokens) <= 5


def test_other_requests_in_the_batch_finish_when_one_is_cancelled(service):
    from rlkit.backends.local.sampler import SampleRequest

    worker = service.create_sampling_client(base_model="tiny")._runtime.sampler
    params = SamplingParams(max_tokens=20, temperature=0.0)
    requests = [SampleRequest([1, 2, 3], 2, params), SampleRequest([4, 5], 1, params)]
    full = worker.sampler.sample(requests)
    again = [SampleRequest([1, 2, 3], 2, params), SampleRequest([4, 5], 1, params)]
    partial = worker.sampler.sample(again, cancelled=lambda request: request is again[0])
    assert partial[0] is None
    assert [s.tokens for s in partial[1].sequences] == [s.tokens for s in full[1].sequences]
