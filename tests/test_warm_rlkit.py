"""The tests' warm start of ``python -m rlkit`` (tests/warm_rlkit.py) answers as the cold start does:
the same exit code, standard output and error for a user error, a finished tiny run and a crash;
its own process, environment and working directory; a timeout kills the command; an environment
that changes what imports read starts cold."""

import os
import subprocess
import sys

import pytest

import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def cold(args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "rlkit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_user_error_and_a_crash_answer_as_a_cold_start(tmp_path):
    bad = ["train", "recipe=no_such_recipe"]
    warm, plain = warm_rlkit.run(bad, cwd=tmp_path), cold(bad, tmp_path)
    assert warm.returncode == plain.returncode == 2
    assert (warm.stdout, warm.stderr) == (plain.stdout, plain.stderr)
    assert warm.stderr.startswith("rlkit: error: ") and "no_such_recipe" in warm.stderr
    # an exception rlkit does not catch: Python's traceback and exit code 1, as a script's
    script = tmp_path / "boom.py"
    script.write_text("import os, sys\nprint(os.getcwd(), os.environ['WARM_PROBE'], sys.argv[1:])\nraise RuntimeError('boom')\n")
    env = {**os.environ, "WARM_PROBE": "seen"}
    warm, plain = warm_rlkit.run(["run", str(script), "x"], cwd=tmp_path, env=env), cold(["run", str(script), "x"], tmp_path, env)
    assert warm.returncode == plain.returncode == 1, (warm.stderr, plain.stderr)
    assert warm.stdout == plain.stdout and "seen" in warm.stdout and str(tmp_path) in warm.stdout
    assert warm.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1] == "RuntimeError: boom"


def test_a_tiny_run_writes_the_same_metrics_warm_and_cold(tmp_path):
    args = ["train", "recipe=sft_gsm8k", "model=tiny", "backend.precision=fp32", "backend.num_threads=1",
            "data.train.limit=16", "data.eval.limit=2", "train.steps=2", "train.batch_tokens=512", "train.warmup_steps=0",
            "train.generate.examples=0"]
    warm = warm_rlkit.run([*args, "run_dir=warm"], cwd=tmp_path)
    plain = cold([*args, "run_dir=cold"], tmp_path)
    assert warm.returncode == plain.returncode == 0, warm.stderr + plain.stderr
    assert (tmp_path / "warm" / "metrics.jsonl").read_text().count("\n") == 3  # steps 0, 1 and the end's evaluation
    drop = ("time", "tok/s", "eta", "seconds", "elapsed")

    def numbers(name):
        import json

        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if not any(d in k for d in drop)} for row in rows]

    assert numbers("warm") == numbers("cold")


def test_its_own_process_and_a_timeout_kills_it(tmp_path):
    script = tmp_path / "pid.py"
    script.write_text("import os, time\nprint(os.getpid(), os.getppid(), flush=True)\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        warm_rlkit.run(["run", str(script)], cwd=tmp_path, timeout=4)
    pid, parent = map(int, caught.value.stdout.split())
    assert pid not in (os.getpid(), parent)
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)  # gone (reaped by its supervisor) within seconds
            import time

            time.sleep(0.1)


def test_one_warm_interpreter_per_environment_as_imports_read_it(tmp_path):
    script = tmp_path / "threads.py"
    script.write_text("import os, torch\nprint(os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads())\n")
    one = warm_rlkit.run(["run", str(script)], cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert one.returncode == 0 and one.stdout.split() == ["1", "1"], one.stderr
    key = tuple(sorted((k, v) for k, v in dict(os.environ, OMP_NUM_THREADS="1").items() if warm_rlkit.IMPORT_TIME_ENV.match(k)))
    assert key in warm_rlkit._WARM  # started with OMP_NUM_THREADS=1, as a cold start would be
    assert warm_rlkit.starts_warm(dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH="/x"))
    for key in ("RLKIT_ALLOCATOR", "LD_PRELOAD", "MIMALLOC_PURGE_DELAY", "RLKIT_TEST_COLD"):
        assert not warm_rlkit.starts_warm(dict(os.environ, **{key: "1"})), key
