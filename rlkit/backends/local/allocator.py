"""Freed tensor memory back to the operating system, on request (glibc's mmap threshold, fixed).

PyTorch's CPU tensors come from ``malloc``. glibc serves a request above ``M_MMAP_THRESHOLD``
(128 KiB at start) with its own ``mmap``, returned to the system on ``free``; smaller requests come
from the heap, whose freed space stays in the process. But the threshold is *dynamic*: each time
an mmapped chunk is freed, glibc raises the threshold to that chunk's size (up to 32 MiB on 64-bit,
``mallopt(3)``). After the first forward pass frees its activations, every later tensor up to
32 MiB — a micro-batch's MLP intermediates, its attention scores, their gradients — comes from
the heap, and the heap's high-water mark stays resident: the process keeps the memory of its
busiest moment and fragments it.

Fixing the threshold (``mallopt(M_MMAP_THRESHOLD, 128 KiB)``, what the environment variable
``MALLOC_MMAP_THRESHOLD_`` does at start-up) turns the dynamic adjustment off: every large tensor
is its own mapping, returned when freed. Measured (``benchmarks/train_memory.py``, one
GSM8K-shaped RL ``forward_backward`` of SmolLM2-135M, 8 groups x 8, fp32, 2 cores): peak RSS
3.52 -> 1.82 GiB with every layer checkpointed, 5.08 -> 3.28 GiB without — but the step took
1.75x as long without checkpointing (82.9 vs 47.5 s) and several times as long with it (every
large allocation is a fresh mapping, page-faulted and zeroed; the larger cost with checkpointing
was not broken down further). So it
is **off by default**: :func:`fix_mmap_threshold` applies it when the local backend connects only
with ``RLKIT_RETURN_FREED_MEMORY=1`` — for a machine where memory, not time, is what runs out
(several jobs at once). It concerns glibc's ``malloc`` only: the ``rlkit`` command runs on mimalloc
(:mod:`rlkit.malloc_preload`, which took the same step's peak lower *and* made it faster), so there
it needs ``RLKIT_ALLOCATOR=system``. A threshold the user set (``MALLOC_MMAP_THRESHOLD_``) is left alone;
elsewhere than glibc (macOS, musl, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

from rlkit import malloc_preload

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>
THRESHOLD_BYTES = 128 * 1024  # glibc's own initial value


@functools.lru_cache(maxsize=None)
def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 128 KiB (see the module docstring); whether it was set here."""
    if os.environ.get("RLKIT_RETURN_FREED_MEMORY", "0").strip().lower() not in ("1", "true", "on", "yes"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:  # the user's own choice, applied by glibc at start-up
        return False
    if malloc_preload.active() != "system":  # malloc is mimalloc/jemalloc/tcmalloc: glibc's mallopt does not reach it
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
    log.debug("glibc mmap threshold fixed at %d bytes: %s", THRESHOLD_BYTES, done)
    return done
