"""``rlkit serve tinker --nproc 2`` (issue 42): the engine sharded over 2 ranks behind the Tinker
API, rank 0 serving HTTP and rank 1 following its engine operations in one order
(:mod:`rlkit.backends.local.follow`). Driven by the real ``tinker`` SDK: two training runs from two
threads at once (their operations must reach both ranks in one order), forward_backward,
optim_step, forward, an in-memory sampler's sample and compute_logprobs — equal to each run alone
on a one-rank server within the ranks tests' tolerance (losses relative 1e-5, logprobs 1e-4). (The
reference runs one after the other: on one process, two runs created at once draw their LoRA
initialisation from torch's one global generator in either order.) Ctrl-C (SIGINT
to the process group) stops it cleanly: rank 0 says so, no process is left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

tinker = pytest.importorskip("tinker")


def _script(url: str, rank: int) -> dict:
    service = tinker.ServiceClient(base_url=url, api_key="tml-local")
    trainer = service.create_lora_training_client(base_model="tiny", rank=rank).result()
    data = [tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(list(range(1 + k, 9 + k + rank))),
                               loss_fn_inputs={"target_tokens": list(range(2 + k, 10 + k + rank)), "weights": [1.0] * (8 + rank)})
            for k in range(2)]
    fb = trainer.forward_backward(data, "cross_entropy").result()
    step = trainer.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result()
    after = trainer.forward(data, "cross_entropy").result()
    sampler = trainer.save_weights_and_get_sampling_client("s")
    params = tinker.types.SamplingParams(max_tokens=4, seed=3, temperature=1.0)
    sample = sampler.sample(tinker.types.ModelInput.from_ints([1, 2, 3]), num_samples=1, sampling_params=params).result()
    scored = sampler.compute_logprobs(tinker.types.ModelInput.from_ints([1, 2, 3, 4, 5])).result()
    return {"loss": fb.metrics["loss:sum"], "grad_norm": step.metrics["grad_norm"], "after": after.metrics["loss:sum"],
            "logprobs": [x for o in fb.loss_fn_outputs for x in o["logprobs"].data], "tokens": sample.sequences[0].tokens,
            "scored": scored[1:]}


def _both(url: str) -> dict:
    """The script for LoRA ranks 2 and 4, on two threads at once."""
    out: dict = {}

    def one(rank: int) -> None:
        out[rank] = _script(url, rank)

    threads = [threading.Thread(target=one, args=(r,)) for r in (2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert set(out) == {2, 4}, "a run did not finish"
    return out


def test_two_ranks_serve_the_one_rank_numbers_and_stop_cleanly(tinker_server, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlkit", "serve", "tinker", "--nproc", "2", "--port", "0", "--state-dir", str(tmp_path),
         "--num-threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the 2-rank server did not print its URL"
        two = _both(url)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in its terminal
        out, _ = proc.communicate(timeout=120)
    assert "server stopped" in out, out[-3000:]
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("a rank outlived the server")
    one = {rank: _script(tinker_server.url, rank) for rank in (2, 4)}  # each run alone
    for rank in (2, 4):
        a, b = one[rank], two[rank]
        for key in ("loss", "grad_norm", "after"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), (rank, key)
        assert b["tokens"] == a["tokens"]
        for key in ("logprobs", "scored"):
            assert b[key] == pytest.approx(a[key], abs=1e-4), (rank, key)


def test_a_rank_count_that_cannot_be_honoured_is_one_line(capsys):
    from rlkit.cli import main

    assert main(["serve", "tinker", "--nproc", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "rlkit: error: rlkit serve tinker: --nproc 0: expected a whole number of ranks >= 1"]
