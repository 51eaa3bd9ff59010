"""Idle OpenMP pools are released (``rlkit/backends/local/threadpools.py``).

Counted in a fresh interpreter, by the threads the process has (``/proc/self/task``): a parallel
matrix product on a thread adds that thread's OpenMP worker; releasing the pool removes it; the
next product builds it again and is still right. A worker thread releases its pool as soon as
its queue runs empty."""

from __future__ import annotations

import json
import subprocess
import sys
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

SCRIPT = r"""
import json, os, time
import torch
torch.set_num_threads(2)
from rlkit.backends.local.threadpools import libgomp, release_idle_pool
from rlkit.backends.local.workers import OrderedWorker

def threads():
    return len(os.listdir("/proc/self/task"))

def settle(expected, timeout=5.0):
    end = time.monotonic() + timeout
    while threads() != expected and time.monotonic() < end:
        time.sleep(0.01)
    return threads()

a = torch.randn(768, 768)
out = {"libgomp": libgomp() is not None}
start = threads()
a @ a
out["main"] = [start, threads()]
out["released"] = release_idle_pool()
out["main_after"] = settle(start)
out["again_right"] = bool(torch.allclose(a @ a, (a.double() @ a.double()).float(), rtol=1e-3, atol=1e-3))
out["main_again"] = threads()
release_idle_pool()
settle(start)
worker = OrderedWorker("rlkit-test")
idle = settle(start + 1)  # the worker thread itself
busy = worker.submit(lambda: (a @ a, threads())[1], operation="mm").result()
out["worker"] = [idle, busy, settle(idle)]
worker.close()
print(json.dumps(out))
"""


def test_idle_pools_are_released_on_the_caller_and_on_workers():
    for _ in range(2):  # thread counts are timing-dependent: check twice, in fresh processes
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["libgomp"], "PyTorch's Linux CPU build runs on libgomp"
        start, with_pool = out["main"]
        assert with_pool == start + 1  # the product started one OpenMP worker
        assert out["released"] and out["main_after"] == start
        assert out["again_right"] and out["main_again"] == start + 1  # rebuilt on demand, results right
        idle, busy, after = out["worker"]
        assert busy == idle + 1  # the job's product started the worker thread's own pool
        assert after == idle  # released when the queue ran empty
