"""Idle OpenMP thread pools are released, so the thread that computes gets the cores.

PyTorch's Linux CPU build parallelises its operations with GNU OpenMP (``libgomp``), which keeps
one pool of worker threads per thread that ever ran a parallel operation, busy or idle. When the
pools' threads together outnumber the cores, ``libgomp`` treats the machine as oversubscribed and
its workers stop spinning between parallel regions: every operation then pays for waking them
(``GOMP_SPINCOUNT`` does not apply in that state). The local backend computes on its own threads
(one trainer worker per session, one sampler worker per model) after the caller's thread loaded
the model, so a 2-core machine ends up with three pools. Measured here (2 cores, 2 torch threads,
SmolLM2-135M in bf16): the same batch-1 greedy decode ran at 55 tok/s on the thread that loaded
the model and at 31 tok/s on a second thread; an 8 x 8 group decode at 833 vs 530 tok/s
(``benchmarks/README.md``).

So a worker releases its thread's pool whenever its queue runs empty, and the service releases the
calling thread's pool after loading models (:func:`release_idle_pool`, OpenMP 5.0's
``omp_pause_resource_all(omp_pause_soft)``, which frees only the calling thread's pool; the next
parallel operation on that thread builds a new one, ~0.1 ms). User code that runs large torch
operations on its own thread between calls builds that thread's pool again, and the slowdown
returns while it lives; the next model load releases it. Where ``libgomp`` is not what
PyTorch runs on (macOS, Windows, other OpenMP runtimes, whose pools behave differently) this does
nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Optional

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1


def _mapped_libgomp() -> Optional[str]:
    """The path of the ``libgomp`` loaded into this process (PyTorch's own copy), or ``None``."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "/libgomp" in path and ".so" in path:
                    return path
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def libgomp() -> Optional[ctypes.CDLL]:
    """PyTorch's ``libgomp``, where it runs on one (looked up once), else ``None``."""
    import torch  # noqa: F401 - loads libgomp if PyTorch uses it

    path = _mapped_libgomp()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
        lib.omp_pause_resource_all.restype = ctypes.c_int
        return lib
    except (OSError, AttributeError) as exc:
        log.debug("libgomp at %s: no omp_pause_resource_all (%s)", path, exc)
        return None


def release_idle_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (it must not be inside a parallel region,
    which Python code never is); ``True`` if ``libgomp`` did."""
    lib = libgomp()
    return lib is not None and lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
