"""``precision="auto"``: choose fp32 or bf16 from what this machine does.

bf16 (autocast training with fp32 master weights, bf16 sampler weights) is only worth its cost —
a sampler/trainer logprob mismatch of ~1e-2 instead of ~1e-6, see ``benchmarks/README.md`` — where
the hardware multiplies bf16 matrices clearly faster than fp32 ones. That differs between machines
that look alike: one 2-core x86 machine of this project's kind measured 880 GFLOP/s bf16 against
210 fp32 (AMX tiles), another 165 bf16 against 314 fp32 (AVX-512 BF16 without AMX), where
rlkit's bf16 training step was 0.62x its fp32 step. So:

- **CUDA**: the hardware flags decide. bf16 where the GPU has bf16 tensor cores (compute
  capability >= 8.0: Ampere and later), fp32 otherwise.
- **CPU**: a matrix-multiply probe (:func:`matmul_gflops`, ~0.5 s) measures both peaks once per
  machine and torch version; the result is cached in ``$RLKIT_CACHE/precision.json`` under a key
  naming the CPU model, its bf16-relevant flags and the torch version. bf16 is
  chosen when its peak is at least :data:`BF16_MIN_SPEEDUP` times the fp32 peak.
- other devices (``mps``, ...): fp32 (no probe).

An explicit ``"fp32"`` / ``"bf16"`` is always kept. The choice and its reason are logged once per
process and machine key (``rlkit.backends.local`` logger, INFO).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from rlkit.errors import InvalidInputError

log = logging.getLogger("rlkit.backends.local")

PRECISIONS = ("auto", "fp32", "bf16")
#: bf16's measured matmul peak must be at least this multiple of fp32's for ``auto`` to pick it:
#: bf16 costs sampler/trainer agreement, and autocast's casts and fp32 norms/softmax dilute a
#: matmul gain (a 4.6x bf16 peak gave a 2.1x training step), so it must win clearly.
BF16_MIN_SPEEDUP = 1.5
_CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "bf16", "sve", "asimd")
_logged: set = set()


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # "fp32" | "bf16"
    reason: str


def check_precision(precision: str) -> str:
    value = getattr(precision, "value", precision)  # a config enum or a string
    if value not in PRECISIONS:
        raise InvalidInputError(f"precision={precision!r}: expected one of {list(PRECISIONS)}")
    return value


def _cpu_info() -> Dict[str, object]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "model name":
                    model = value.strip()
                elif key in ("flags", "features"):
                    flags = set(value.split())
                if key == "" and flags:  # first processor block is enough
                    break
    except OSError:
        pass
    return {"model": model, "flags": sorted(f for f in _CPU_FLAGS if f in flags)}


def machine_key() -> str:
    """What the probe result depends on: CPU model and its bf16-relevant flags, torch version."""
    info = _cpu_info()
    return f"{platform.machine()}|{info['model']}|{','.join(info['flags'])}|torch={torch.__version__}"


def matmul_gflops(dtype: torch.dtype, *, size: int = 512, seconds: float = 0.2) -> float:
    """Best-of GFLOP/s of ``size x size`` matrix products in ``dtype`` on the CPU (~``seconds``).

    The best single product, not the mean, so that a busy machine reads as close to its peak as
    it can be (both dtypes are measured the same way, alternately)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    for _ in range(2):
        a @ b
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def probe_cpu() -> Dict[str, float]:
    """Both one-thread peaks, measured in alternation (two rounds each), in GFLOP/s.

    One thread: the ratio is what the core's instructions do, and on a machine shared with other
    jobs a multi-threaded product mostly measures its threads waiting for each other (on a loaded
    2-core machine, 2-thread fp32 products of 256 x 256 ran at 1 GFLOP/s, one-thread ones at 110)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32 = bf16 = 0.0
        for _ in range(2):
            fp32 = max(fp32, matmul_gflops(torch.float32, seconds=0.1))
            bf16 = max(bf16, matmul_gflops(torch.bfloat16, seconds=0.1))
    finally:
        torch.set_num_threads(threads)
    return {"fp32_gflops": fp32, "bf16_gflops": bf16}


def decide_from_peaks(fp32_gflops: float, bf16_gflops: float) -> PrecisionChoice:
    ratio = bf16_gflops / fp32_gflops if fp32_gflops > 0 else 0.0
    measured = f"one-thread matmul {fp32_gflops:.0f} GFLOP/s fp32, {bf16_gflops:.0f} bf16 ({ratio:.2f}x)"
    if ratio >= BF16_MIN_SPEEDUP:
        return PrecisionChoice("bf16", f"{measured} >= {BF16_MIN_SPEEDUP}x")
    return PrecisionChoice("fp32", f"{measured} < {BF16_MIN_SPEEDUP}x")


def _read_cache(path: Path) -> Dict[str, dict]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, data: Dict[str, dict]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".precision-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache costs a probe per process, nothing else
        log.debug("could not write %s: %s", path, exc)


def cache_path() -> Path:
    from rlkit.backends.local.models import cache_dir

    return cache_dir() / "precision.json"


def cpu_choice(*, probe: Callable[[], Dict[str, float]] = probe_cpu, path: Optional[Path] = None, key: Optional[str] = None) -> PrecisionChoice:
    """The CPU decision, from the cached probe result for this machine key or a fresh probe."""
    path = path or cache_path()
    key = key or machine_key()
    cache = _read_cache(path)
    entry = cache.get(key)
    if isinstance(entry, dict) and {"fp32_gflops", "bf16_gflops"} <= entry.keys():
        choice = decide_from_peaks(float(entry["fp32_gflops"]), float(entry["bf16_gflops"]))
        return PrecisionChoice(choice.precision, f"{choice.reason}; probed {entry.get('measured', 'earlier')}, cached in {path}")
    peaks = probe()
    cache = _read_cache(path)  # another process may have written meanwhile
    cache[key] = {**peaks, "measured": time.strftime("%Y-%m-%d %H:%M")}
    _write_cache(path, cache)
    choice = decide_from_peaks(peaks["fp32_gflops"], peaks["bf16_gflops"])
    return PrecisionChoice(choice.precision, f"{choice.reason}; probed now, cached in {path}")


def cuda_choice(device: torch.device) -> PrecisionChoice:
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if (major, minor) >= (8, 0):
        return PrecisionChoice("bf16", f"{name} (compute capability {major}.{minor}) has bf16 tensor cores")
    return PrecisionChoice("fp32", f"{name} (compute capability {major}.{minor}) has no bf16 tensor cores")


def resolve_precision(precision: str, device: torch.device, **cpu_kwargs) -> PrecisionChoice:
    """``"fp32"``/``"bf16"`` as given; ``"auto"`` decided for ``device`` (see the module docstring)
    and logged once."""
    precision = check_precision(precision)
    if precision != "auto":
        return PrecisionChoice(precision, "requested")
    if device.type == "cuda":
        choice = cuda_choice(device)
    elif device.type == "cpu":
        choice = cpu_choice(**cpu_kwargs)
    else:
        choice = PrecisionChoice("fp32", f"no precision probe for device type {device.type!r}")
    note = (device.type, choice.precision, choice.reason.split(";")[0])
    if note not in _logged:
        _logged.add(note)
        log.info("precision=auto: %s on %s (%s)", choice.precision, device, choice.reason)
    return choice
