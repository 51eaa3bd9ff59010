"""Where the local backend runs: one ``torch.device`` for weights, key/value caches, autocast and
random number generators.

``device=None`` means CUDA when this torch sees a GPU (``cuda:0``), else the CPU. Every tensor the
engine and sampler make is created on :attr:`model's device <torch.nn.Module>`; the only
device-specific code is here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator, Optional

import torch

from rlkit.errors import InvalidInputError


def rank_cuda_index() -> int:
    """The CUDA device of this process: ``torchrun``'s ``LOCAL_RANK`` on N ranks (rank k of a node
    on its GPU k, as torchrun intends), 0 in one process."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return int(os.environ.get("LOCAL_RANK", "0") or 0)
    return 0


def resolve_device(device: Optional[str | torch.device] = None) -> torch.device:
    """``None`` -> CUDA if available else ``cpu``; a name is checked (one-line error). ``None`` and
    ``"cuda"`` without an index mean this rank's GPU (:func:`rank_cuda_index`: ``cuda:LOCAL_RANK``
    under ``torchrun``, ``cuda:0`` in one process); ``cuda:N`` is that device on every rank."""
    if device is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        device = "cuda"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidInputError(f"device={device!r}: not a torch device ({str(exc).splitlines()[0]})") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidInputError(f"device={device!r}: this torch ({torch.__version__}) sees no CUDA device")
        index = rank_cuda_index() if resolved.index is None else resolved.index
        if index >= torch.cuda.device_count():
            whose = f" (rank {index} of this node takes GPU {index})" if resolved.index is None and index else ""
            raise InvalidInputError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s){whose}")
        resolved = torch.device("cuda", index)
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise InvalidInputError(f"device={device!r}: MPS is not available here")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        raise InvalidInputError(f"device={device!r}: expected cpu, cuda[:N] or mps")
    return resolved


def autocast(device: torch.device, precision: str):
    """bf16 autocast on ``device`` for ``precision="bf16"``; nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` (random draws happen where the logits are), seeded."""
    return torch.Generator(device=device).manual_seed(int(seed))


_GLOBAL_RNG = threading.RLock()


@contextlib.contextmanager
def seeded_global_rng(seed: int) -> Iterator[None]:
    """Torch's global CPU generator seeded with ``seed`` inside the block and restored after it,
    one thread at a time: for initialisers that take no generator (PEFT's LoRA init, a model built
    from its config). Without the lock, two runs creating adapters at once on one process (the
    Tinker server, ``jobs=shared``) interleave their draws and neither gets its seed's adapter."""
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield
