"""Faults and bad launches on N ranks (issue 42 item 4). A rank that raises or hangs ends every rank
in bounded time and ``rlkit``'s launcher (torch's elastic agent in-process) says it in ONE line
naming the rank and the cause, exit code the rank's own (tests/backends/test_local_ranks_train.py
kills a rank with SIGKILL: exit 137). A launch that cannot work is one line before anything loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlkit.backends.local.distributed import ranks_to_launch
from rlkit.backends.local.ranks_launch import LINE_PREFIX, failure_line
from rlkit.runs import resume_hint
from rlkit.errors import ConfigError

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

WORKER = Path(__file__).with_name("ranks_fault_worker.py")


def _launch(mode: str, timeout_s: float = 120):
    """``rlkit run ranks_fault_worker.py MODE`` on 2 ranks through rlkit's launcher."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK_TIMEOUT_S": str(timeout_s)}
    code = f"import sys; from rlkit.backends.local.distributed import launch; sys.exit(launch(2, ['run', {str(WORKER)!r}, {mode!r}]))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)


def test_an_exception_on_one_rank_is_one_line_naming_it():
    proc = _launch("raise")
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # no per-rank traceback, no torchrun report
    assert lines[0].startswith(LINE_PREFIX + "rank 1 (pid ") and " raised ValueError: bad row 7 (traceback: " in lines[0]
    traceback_file = lines[0].rsplit("(traceback: ", 1)[1].rstrip(")")
    assert "bad row 7" in json.loads(Path(traceback_file).read_text())["message"]["extraInfo"]["py_callstack"]


def test_a_hung_rank_ends_the_run_at_the_rank_timeout():
    proc = _launch("hang", timeout_s=3)  # rank 1 sleeps 600 s: rank 0's barrier times out, the agent stops rank 1
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(LINE_PREFIX + "rank 0 (pid ") and "timed out waiting for the other ranks" in line
    assert "backend.rank_timeout_s" in line


def _cfg(**backend):
    return OmegaConf.create({"backend": {"name": "local", "nproc": 2, "device": None, "rank_timeout_s": None,
                                         "dist_backend": "auto", **backend}})


@pytest.mark.parametrize("backend, said", [
    ({"nproc": 0}, "backend.nproc=0: expected a whole number of ranks >= 1"),
    ({"name": "tinker"}, "backend.nproc=2: only backend=local trains on N ranks (backend=tinker sizes itself)"),
    ({"device": "cuda"}, "backend.nproc=2: this node has 0 CUDA device(s)"),
    ({"dist_backend": "nccl"}, "backend.dist_backend=nccl: NCCL needs CUDA devices and this machine has none"),
    ({"dist_backend": "mpi"}, "backend.dist_backend='mpi': expected one of auto, gloo, nccl"),
    ({"rank_timeout_s": -1}, "backend.rank_timeout_s=-1: expected seconds > 0"),
])
def test_a_launch_that_cannot_work_is_one_line(backend, said):
    import torch

    if backend.get("device") == "cuda" and torch.cuda.device_count() >= 2 or backend.get("dist_backend") == "nccl" and torch.cuda.is_available():
        pytest.skip("this machine has the CUDA devices the refusal is about")
    with pytest.raises(ConfigError) as err:
        ranks_to_launch(_cfg(**backend))
    assert str(err.value).startswith(said)


def test_under_torchrun_another_count_or_backend_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="backend.nproc=3 but torchrun started 2 ranks"):
        ranks_to_launch(_cfg(nproc=3))
    with pytest.raises(ConfigError, match="torchrun's 2 ranks: only backend=local trains on N ranks"):
        ranks_to_launch(_cfg(nproc=1, name="sagemaker"))


def test_more_cpu_ranks_than_cores_is_allowed_with_a_warning(caplog):
    n = (os.cpu_count() or 1) + 1
    assert ranks_to_launch(_cfg(nproc=n, device="cpu")) == n
    assert f"backend.nproc={n} on" in caplog.text and "share cores" in caplog.text


class _Failure:
    """A ``ProcessFailure``'s fields (torch builds them from a rank's exit code and error file)."""

    def __init__(self, exitcode, message="", timestamp=0, pid=10):
        from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

        self.exitcode, self.message, self.timestamp, self.pid = exitcode, message, timestamp, pid
        self.error_file, self.error_file_data = "<N/A>", {"message": message} if message else {}
        self.signal_name = lambda: ProcessFailure.signal_name(self)


def test_the_cause_is_the_killed_or_raising_rank_not_the_collateral(tmp_path):
    collateral = _Failure(-15, "RuntimeError: [gloo/pair.cc:537] Read error: Connection reset by peer.", timestamp=0)
    line, code = failure_line({0: collateral, 1: _Failure(-9, timestamp=1, pid=77)})
    assert (line, code) == ("rank 1 (pid 77) was killed by SIGKILL (kill -9, or the kernel's OOM killer when memory "
                            "runs out: see dmesg)", 137)
    line, code = failure_line({0: _Failure(-15), 1: _Failure(2, LINE_PREFIX + "forward: rank(s) [1] passed another batch", 5)})
    assert (line, code) == ("rank 1 (pid 10): forward: rank(s) [1] passed another batch", 2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    (run / "checkpoints.jsonl").write_text('{"step": 1}\n{"step": 3}\n')
    line, _ = failure_line({1: _Failure(-9)}, lambda: resume_hint(str(run)))
    assert line.endswith(f"; the run's last checkpoint is step 3: resume it with: rlkit train resume={run}")


def test_the_same_batch_check_takes_rounding_but_not_another_batch():
    """What every rank's forward/forward_backward compares (distributed.batch_digest): tokens and
    integer inputs exactly, float inputs within rel 1e-4 (sampler logprobs rounded differently in
    another decode batch) — an advantage that differs, or one token, is another batch."""
    from helpers import rl_datum

    from rlkit.backends.local.distributed import _same_digest, batch_digest

    def batch(logprob=-1.5, advantage=1.0, last=62):
        return [rl_datum([1, 5, 6, 60, 61, last, 2], [logprob] * 7, advantage, prompt_len=3)]

    base = batch_digest(batch())
    assert _same_digest(base, batch_digest(batch(logprob=-1.5 * (1 + 3e-7))))
    assert not _same_digest(base, batch_digest(batch(advantage=1.1)))
    assert not _same_digest(base, batch_digest(batch(last=63)))
