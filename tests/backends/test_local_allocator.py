"""With RLKIT_RETURN_FREED_MEMORY=1, glibc's mmap threshold is fixed when the local backend connects
(rlkit.backends.local.allocator), so memory freed by a step goes back to the system instead of staying in a
fragmented heap; off by default (it costs time). A fresh interpreter."""

import subprocess
import sys

import pytest

PROBE = r"""
import psutil, torch, rlkit

def resident_after_churn():
    before = psutil.Process().memory_info().rss
    big = torch.ones(4 << 20); del big                        # a freed 16 MiB mapping: glibc's dynamic threshold rises to it
    tensors = [torch.ones(1 << 20) for _ in range(200)]       # 200 x 4 MiB
    kept = tensors[::10]; del tensors                         # every 10th survives: holes all over a heap
    return (psutil.Process().memory_info().rss - before) >> 20, kept

untuned, kept = resident_after_churn()                        # glibc's defaults
from rlkit.backends.local.allocator import fix_mmap_threshold
rlkit.connect("local", precision="fp32", device="cpu")
tuned, kept2 = resident_after_churn()
print(fix_mmap_threshold(), untuned, tuned)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_tensors_go_back_to_the_system_once_the_backend_connects_when_asked():
    import os

    env = {**os.environ, "RLKIT_RETURN_FREED_MEMORY": "1"}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    fixed, untuned, tuned = out.stdout.split()
    # 180 freed 4 MiB tensors are 720 MiB: resident with glibc's dynamic threshold, returned with it fixed
    assert fixed == "True" and int(untuned) > 600 and int(tuned) < 200, out.stdout


def test_off_by_default_and_a_users_own_threshold_is_left_alone(monkeypatch):
    from rlkit.backends.local.allocator import fix_mmap_threshold

    monkeypatch.delenv("RLKIT_RETURN_FREED_MEMORY", raising=False)
    assert fix_mmap_threshold.__wrapped__() is False
    monkeypatch.setenv("RLKIT_RETURN_FREED_MEMORY", "1")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert fix_mmap_threshold.__wrapped__() is False
