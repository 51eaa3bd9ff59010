"""Local checkpoints: atomic directories in PEFT's adapter format, named by ``local://`` ids.

A checkpoint directory holds ``adapter_model.safetensors`` + ``adapter_config.json`` (loadable by
``transformers`` + ``peft`` alone: ``PeftModel.from_pretrained(base, path)``), ``optimizer.pt``
for ``save_state`` checkpoints, and ``rlkit_checkpoint.json`` (kind, base model, LoRA shape,
step, description). It is written to a temporary sibling directory and renamed into place, so a
reader never sees a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from rlkit.errors import CheckpointNotFoundError, InvalidInputError

SCHEME = "local://"
META = "rlkit_checkpoint.json"


def checkpoint_id(path: Path) -> str:
    return SCHEME + str(Path(path).resolve())


def resolve(checkpoint: str) -> Path:
    """The directory of checkpoint id ``checkpoint``; :class:`CheckpointNotFoundError` if none."""
    if not isinstance(checkpoint, str) or not checkpoint:
        raise CheckpointNotFoundError(f"checkpoint id must be a non-empty string, got {checkpoint!r}")
    raw = checkpoint[len(SCHEME):] if checkpoint.startswith(SCHEME) else checkpoint
    path = Path(raw)
    if not (path / META).is_file():
        raise CheckpointNotFoundError(f"no checkpoint at {checkpoint!r} (expected {path / META})")
    return path


def read_meta(checkpoint: str) -> Dict[str, Any]:
    return json.loads((resolve(checkpoint) / META).read_text())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    root: Path,
    name: str,
    *,
    peft_model: Any,
    optimizer: Optional[torch.optim.Optimizer],
    meta: Dict[str, Any],
    overwrite: bool = False,
) -> str:
    """Write a checkpoint directory ``root/name`` atomically; return its id."""
    if not name or "/" in name or name.startswith("."):
        raise InvalidInputError(f"checkpoint name {name!r} must be a plain, non-hidden file name")
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.exists() and not overwrite:
        raise InvalidInputError(f"checkpoint {final} already exists (pass overwrite=True or another name)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        peft_model.save_pretrained(tmp)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / META).write_text(json.dumps({**meta, "created": time.time()}, indent=2, sort_keys=True))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            old = root / f".{name}.old-{os.getpid()}-{time.time_ns()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return checkpoint_id(final)


def load_adapter_tensors(checkpoint: str) -> Dict[str, torch.Tensor]:
    """The raw PEFT adapter tensors of a checkpoint (keys as PEFT wrote them)."""
    from safetensors.torch import load_file

    return load_file(str(resolve(checkpoint) / "adapter_model.safetensors"))


def load_optimizer_state(checkpoint: str) -> Dict[str, Any]:
    path = resolve(checkpoint) / "optimizer.pt"
    if not path.is_file():
        raise InvalidInputError(
            f"checkpoint {checkpoint!r} holds weights only (save_weights_for_sampler); "
            "load_state_with_optimizer needs a save_state checkpoint"
        )
    return torch.load(path, weights_only=True)


def adapter_from_tensors(tensors: Dict[str, torch.Tensor], scale: float) -> Dict[str, tuple]:
    """Group PEFT keys ``base_model.model.<path>.lora_{A,B}.weight`` into ``{path: (A, B, scale)}``."""
    grouped: Dict[str, Dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        stem = key[len("base_model.model."):] if key.startswith("base_model.model.") else key
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in stem:
                path = stem.split(marker)[0]
                grouped.setdefault(path, {})[part] = value
    return {path: (ab["lora_A"], ab["lora_B"], scale) for path, ab in grouped.items() if "lora_A" in ab and "lora_B" in ab}
