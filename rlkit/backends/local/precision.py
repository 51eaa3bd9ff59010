"""``precision="auto"``: choose fp32 or bf16 from what this machine does.

bf16 (autocast training with fp32 master weights, bf16 sampler weights) is only worth its cost —
a sampler/trainer logprob mismatch of ~1e-2 instead of ~1e-6, see ``benchmarks/README.md`` — where
the hardware multiplies bf16 matrices clearly faster than fp32 ones. That differs between machines
that look alike: one 2-core x86 machine of this project's kind measured 880 GFLOP/s bf16 against
210 fp32 (AMX tiles), another 165 bf16 against 314 fp32 (AVX-512 BF16 without AMX), where
rlkit's bf16 training step was 0.62x its fp32 step. So:

- **CUDA**: the hardware flags decide. bf16 where the GPU has bf16 tensor cores (compute
  capability >= 8.0: Ampere and later), fp32 otherwise.
- **CPU**: a one-thread probe (:func:`probe_cpu`, ~1 s) measures both matmul peaks once per
  machine and torch version; the result is cached in ``$RLKIT_CACHE/precision.json`` under a key
  naming the CPU model, its bf16-relevant flags and the torch version. bf16 is
  chosen when its peak is at least :data:`BF16_MIN_SPEEDUP` times the fp32 peak.
- other devices (``mps``, ...): fp32 (no probe).

The same CPU probe also times fp32 ``F.linear`` (MKL) against oneDNN at a decode-sized product:
on one AMD EPYC machine oneDNN ran fp32 products 1.5-2x faster than MKL (MKL's fast paths are
Intel-only), so the sampler's fp32 decode uses whichever is faster here (:func:`fp32_linear`).

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
from typing import Callable, Dict, Optional, Tuple

import torch

from rlkit.errors import InvalidInputError

log = logging.getLogger("rlkit.backends.local")

PRECISIONS = ("auto", "fp32", "bf16")
#: bf16's measured matmul peak must be at least this multiple of fp32's for ``auto`` to pick it:
#: bf16 costs sampler/trainer agreement, and autocast's casts and fp32 norms/softmax dilute a
#: matmul gain (a 4.6x bf16 peak gave a 2.1x training step), so it must win clearly.
BF16_MIN_SPEEDUP = 1.5
PROBE_KEYS = ("fp32_gflops", "bf16_gflops", "fp32_linear_aten_gflops", "fp32_linear_onednn_gflops")
#: the sampler's fp32 products go through oneDNN where it is at least this much faster than ``F.linear``
ONEDNN_MIN_SPEEDUP = 1.1
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


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear`` through oneDNN, the kernel PyTorch already uses for bf16 on the CPU (its fp32
    products go to MKL, which on some CPUs runs at half oneDNN's speed; see :func:`fp32_linear`)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear_gflops(linear: Callable, *, rows: int = 16, seconds: float = 0.1) -> float:
    """Best-of GFLOP/s of ``linear(x [rows, 1024], W [2048, 1024])`` in float32 (a decode-sized
    product with a weight larger than a core's L2 cache); 0 if the kernel fails."""
    x, w = torch.randn(rows, 1024), torch.randn(2048, 1024)
    try:
        if not torch.allclose(linear(x, w), x @ w.T, rtol=1e-4, atol=1e-3):
            return 0.0
    except (RuntimeError, AttributeError):
        return 0.0
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return 2 * rows * 1024 * 2048 / best / 1e9


def probe_cpu() -> Dict[str, float]:
    """One-thread measurements, in alternation (two rounds each, best of), in GFLOP/s: the fp32 and
    bf16 matmul peaks (for the precision), and fp32 ``F.linear`` vs :func:`onednn_linear` at a
    decode-sized product (for the sampler's fp32 kernel).

    One thread: the ratios are what the core's instructions do, and on a machine shared with other
    jobs a multi-threaded product mostly measures its threads waiting for each other (on a loaded
    2-core machine, 2-thread fp32 products of 256 x 256 ran at 1 GFLOP/s, one-thread ones at 110)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = dict.fromkeys(PROBE_KEYS, 0.0)
        for _ in range(2):
            out["fp32_gflops"] = max(out["fp32_gflops"], matmul_gflops(torch.float32, seconds=0.1))
            out["bf16_gflops"] = max(out["bf16_gflops"], matmul_gflops(torch.bfloat16, seconds=0.1))
            out["fp32_linear_aten_gflops"] = max(out["fp32_linear_aten_gflops"], linear_gflops(torch.nn.functional.linear))
            out["fp32_linear_onednn_gflops"] = max(out["fp32_linear_onednn_gflops"], linear_gflops(onednn_linear))
    finally:
        torch.set_num_threads(threads)
    return out


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


def cpu_probe(*, probe: Callable[[], Dict[str, float]] = probe_cpu, path: Optional[Path] = None, key: Optional[str] = None) -> Tuple[Dict[str, float], str]:
    """This machine's probe result (cached for its key, else measured now and cached) and where
    it came from."""
    path = path or cache_path()
    key = key or machine_key()
    entry = _read_cache(path).get(key)
    if isinstance(entry, dict) and set(PROBE_KEYS) <= entry.keys():
        return {k: float(entry[k]) for k in PROBE_KEYS}, f"probed {entry.get('measured', 'earlier')}, cached in {path}"
    peaks = {k: float(v) for k, v in probe().items()}
    cache = _read_cache(path)  # another process may have written meanwhile
    cache[key] = {**peaks, "measured": time.strftime("%Y-%m-%d %H:%M")}
    _write_cache(path, cache)
    return peaks, f"probed now, cached in {path}"


def cpu_choice(**probe_kwargs) -> PrecisionChoice:
    """The CPU precision decision, from :func:`cpu_probe`."""
    peaks, source = cpu_probe(**probe_kwargs)
    choice = decide_from_peaks(peaks["fp32_gflops"], peaks["bf16_gflops"])
    return PrecisionChoice(choice.precision, f"{choice.reason}; {source}")


def fp32_linear(**probe_kwargs) -> Tuple[Callable, str]:
    """The fp32 matrix-product kernel for the CPU sampler: :func:`onednn_linear` where the probe
    measured it >= :data:`ONEDNN_MIN_SPEEDUP` x ``F.linear`` (MKL), else ``F.linear``."""
    peaks, _ = cpu_probe(**probe_kwargs)
    aten, onednn = peaks["fp32_linear_aten_gflops"], peaks["fp32_linear_onednn_gflops"]
    measured = f"one-thread fp32 linear {aten:.0f} GFLOP/s F.linear, {onednn:.0f} oneDNN"
    if aten > 0 and onednn >= ONEDNN_MIN_SPEEDUP * aten:
        return onednn_linear, f"oneDNN ({measured})"
    return torch.nn.functional.linear, f"F.linear ({measured})"


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
