"""Rollouts data-parallel over 2 ranks (issue 42 item 2; rlkit.rl.rank_rollouts), under
``torchrun --nproc-per-node 2`` with gloo and the tiny model's real sampler: each rank samples only
its share of the groups, every rank returns all of them, identical; two calls started on two threads
in opposite orders on the two ranks still pair up; a group that raises on one rank raises on both;
the store is left clean. (That an RL recipe on 2 ranks gives the one-process numbers:
tests/backends/test_local_ranks_recipes.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

WORKER = Path(__file__).with_name("rank_rollouts_worker.py")


def test_two_ranks_each_roll_out_a_share_and_return_every_group(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(WORKER), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert zero["sampled"] == [0, 2, 4] and one["sampled"] == [1, 3]  # a share each, whole groups, nothing twice
    assert len(zero["groups"]) == 5 and zero["groups"] == one["groups"]
    assert all(len(g["tokens"]) == 3 and len(g["rewards"]) == 3 for g in zero["groups"])
    assert set(zero["concurrent"]) == {"a", "b"} and zero["concurrent"] == one["concurrent"]
    assert zero["concurrent"]["a"] != zero["concurrent"]["b"]  # other seeds: the calls did not swap results
    assert zero["error"] == one["error"] and "no envs for" in zero["error"]
    assert zero["keys_left"] == 0 and one["keys_left"] == 0
