"""Activation checkpointing under FSDP2 on 2 ranks (gloo, the tiny model): a checkpointed layer
recomputes its forward in backward — inside FSDP2's unsharded window, no extra collective — and the
losses and grad norms are those without checkpointing; a rank may checkpoint other layers than
another (``auto`` decides per rank from its share)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

WORKER = Path(__file__).with_name("ranks_checkpointing_worker.py")


def test_checkpointing_under_fsdp2_recomputes_and_changes_no_number(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER), str(out)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    off, every, rank0 = got["off"], got["all"], got["rank0"]
    for steps in (every, rank0):
        for a, b in zip(off, steps):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-6) and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    assert all(set(s["layers"]) == {0} for s in off) and all(set(s["layers"]) == {2} for s in every + rank0)
    # rank 0's layers ran forward twice when checkpointed (once more in backward)
    assert all(b["forwards"] == 2 * a["forwards"] for a, b in zip(off, every))
    assert all(b["forwards"] == 2 * a["forwards"] for a, b in zip(off, rank0))
