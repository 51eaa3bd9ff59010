"""Out of memory in the local engine's forward/backward, as one line naming the knobs.

PyTorch reports it as :class:`torch.cuda.OutOfMemoryError` on a GPU and, on the host, as a
:class:`MemoryError` or a ``RuntimeError`` whose message says the allocator could not allocate
("DefaultCPUAllocator: can't allocate memory", "out of memory"). The engine raises the error
returned here after leaving its handler (so the failed micro-batch's graph is freed); the training
client then restores the gradients accumulated before the call, so the session stays usable.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.errors import OperationError

_HOST_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _HOST_MESSAGES)


def out_of_memory_error(op: str, number: int, of: int, tokens: int, datums: int, budget: int,
                        layers: int, n_layers: int, mode: Any, exc: BaseException) -> OperationError:
    where = "the GPU" if isinstance(exc, torch.cuda.OutOfMemoryError) else "host memory"
    setting = {True: "true", False: "false"}.get(mode, mode)
    return OperationError(
        f"{op}: out of memory ({where}) in micro-batch {number} of {of} ({tokens} padded tokens, {datums} datums; "
        f"activation checkpointing on {layers} of {n_layers} layers); lower backend.micro_batch_tokens (now {budget}) "
        f"or set backend.activation_checkpointing=true (now {setting}); this call's gradients were discarded, "
        "earlier ones are kept"
    )
