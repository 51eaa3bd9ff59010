"""``rlkit conformance local --nproc 2`` (issue 42): the suite on the local engine sharded over 2
ranks (torch's elastic agent started by the command, gloo on CPU, the tiny model), SPMD: rank 0
alone prints the report, exit code from the results. One launch, a representative subset for CI
time (cross-entropy's first-order step and ppo against its reference — each after a save_state,
where a DCP save once made the next step Adam's second —, save/load with a pinned sampler,
submission order, sampling); the whole suite (19 pass on 2 ranks) is run by hand. ``--nproc`` on another engine is one
line, exit 2, before anything connects."""

from __future__ import annotations

import os
import subprocess
import sys

from rlkit.cli import main
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def test_conformance_on_two_ranks_passes_and_rank_0_alone_reports():
    only = ["--only", "cross-entropy", "--only", "built-in ppo", "--only", "save/load", "--only", "ordering", "--only", "sampling"]
    proc = subprocess.run([sys.executable, "-m", "rlkit", "conformance", "local", "--nproc", "2", *only],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("the local engine on 2 ranks") == 1 and out.count("contract checks") == 1  # rank 0 alone
    assert "state/a sampler keeps its version" in out and "order/submission order" in out
    assert out.strip().splitlines()[-1] == "7 pass, 0 refused, 0 wrong, 0 error"


def test_nproc_on_another_engine_is_one_line(capsys):
    assert main(["conformance", "tinker", "--nproc", "2", "--base-url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlkit: error: conformance tinker: --nproc 2: only the local engine runs on N ranks (this engine sizes itself)"]
