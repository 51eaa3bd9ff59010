"""glibc's mmap threshold is fixed when the local backend connects (rlkit.backends.local.allocator), so
memory freed by a step goes back to the system instead of staying in a fragmented heap. Fresh interpreters."""

import subprocess
import sys

import pytest

PROBE = r"""
import os, sys, psutil, torch, rlkit
from rlkit.backends.local.allocator import fix_mmap_threshold
rlkit.connect("local", precision="fp32", device="cpu")
big = torch.ones(4 << 20); del big                       # a freed 16 MiB mapping: glibc's threshold would rise to it
kept, tensors = [], [torch.ones(1 << 20) for _ in range(200)]  # 200 x 4 MiB
kept = tensors[::10]; del tensors                        # every 10th survives: holes everywhere in a heap
print(fix_mmap_threshold(), psutil.Process().memory_info().rss >> 20)
"""


def probe(env):
    import os

    out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    fixed, rss_mib = out.stdout.split()
    return fixed == "True", int(rss_mib)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_tensors_go_back_to_the_system_unless_opted_out():
    fixed, rss = probe({})
    kept_off, rss_off = probe({"RLKIT_MALLOC_TUNING": "0"})
    assert fixed and not kept_off
    # 180 freed 4 MiB tensors are 720 MiB: returned with the threshold fixed, resident without it
    assert rss_off - rss > 500, (rss, rss_off)


def test_a_users_own_threshold_is_left_alone(monkeypatch):
    from rlkit.backends.local.allocator import fix_mmap_threshold

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert fix_mmap_threshold.__wrapped__() is False
