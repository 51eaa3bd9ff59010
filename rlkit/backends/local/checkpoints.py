"""Local checkpoints: atomic directories in PEFT's adapter format, named by ``local://`` ids.

A checkpoint directory holds ``adapter_model.safetensors`` + ``adapter_config.json`` (loadable by
``transformers`` + ``peft`` alone: ``PeftModel.from_pretrained(base, path)``), ``optimizer.pt``
for ``save_state`` checkpoints, and ``rlkit_checkpoint.json`` (kind, base model, LoRA shape,
step, description). A full fine-tuning checkpoint (``rank`` 0 in its metadata) holds the whole
model instead, as ``save_pretrained`` writes it: ``model.safetensors`` + ``config.json`` (loadable
by ``transformers.AutoModelForCausalLM.from_pretrained(path)`` alone). It is written to a temporary sibling directory and renamed into place, so a
reader never sees a half-written checkpoint.

**A checkpoint proves itself.** ``rlkit_checkpoint.json`` records the size and SHA-256 of every
other file (``files``) and a SHA-256 of its own content (``meta_sha256``). Every read goes through
:func:`read_file`, which compares the bytes it read with that record, and every parse failure is
turned into the same error: a truncated, missing, overwritten or unparseable file raises
:class:`~rlkit.errors.CheckpointCorruptError` naming the checkpoint and the file, never a raw
``SafetensorError`` / ``JSONDecodeError`` / ``FileNotFoundError``. :func:`verify` checks a whole
checkpoint without loading it. Checkpoints written before checksums existed (no ``files``) are
still read; only their presence and parseability can be checked.

**On N ranks** (:mod:`.distributed`) a ``save_state`` checkpoint is ``torch.distributed.checkpoint``'s
sharded files instead (:mod:`.dcp_state`: each rank writes its own shards, nothing gathered; its
metadata says ``"format": "dcp"``), under the same rules — atomic, every file checksummed, verified
before it is read — and it loads on any number of ranks, or in one process. A
``save_weights_for_sampler`` checkpoint is the export format on any number of ranks: the adapter, or
the ``from_pretrained`` directory, gathered and written by rank 0 alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from rlkit.backends.local import dcp_state, distributed
from rlkit.errors import CheckpointCorruptError, CheckpointNotFoundError, InvalidInputError

SCHEME = "local://"
META = "rlkit_checkpoint.json"
ADAPTER = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
OPTIMIZER = "optimizer.pt"
WEIGHTS = "model.safetensors"  # a full fine-tuning checkpoint's weights (save_pretrained, one file)
MODEL_CONFIG = "config.json"
SAMPLER_FILES = (ADAPTER, ADAPTER_CONFIG)  # what a sampler reads (verify: of a full checkpoint, its WEIGHTS and MODEL_CONFIG)
_CHUNK = 1 << 22


def checkpoint_id(path: Path) -> str:
    return SCHEME + str(Path(path).resolve())


def resolve(checkpoint: str) -> Path:
    """The directory of checkpoint id ``checkpoint``: :class:`CheckpointNotFoundError` if there is
    none, :class:`CheckpointCorruptError` if the directory lost its metadata file."""
    if not isinstance(checkpoint, str) or not checkpoint:
        raise CheckpointNotFoundError(f"checkpoint id must be a non-empty string, got {checkpoint!r}")
    raw = checkpoint[len(SCHEME):] if checkpoint.startswith(SCHEME) else checkpoint
    path = Path(raw)
    if not (path / META).is_file():
        if path.is_dir() and any((path / f).exists() for f in (ADAPTER, WEIGHTS, dcp_state.DIR)):
            raise _corrupt(checkpoint, META, "is missing")
        raise CheckpointNotFoundError(f"no checkpoint at {checkpoint!r} (expected {path / META})")
    return path


def _corrupt(checkpoint: str, name: str, problem: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"checkpoint {checkpoint}: {name} {problem}", checkpoint=checkpoint, file=name)


def _meta_digest(meta: Dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_meta(checkpoint: str) -> Dict[str, Any]:
    """The checkpoint's metadata, checked against its own checksum."""
    path = resolve(checkpoint) / META
    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(checkpoint, META, f"is not valid JSON ({exc})") from None
    except OSError as exc:
        raise _corrupt(checkpoint, META, f"cannot be read ({exc.strerror or exc})") from None
    if not isinstance(meta, dict):
        raise _corrupt(checkpoint, META, "is not a JSON object")
    if "meta_sha256" in meta and meta["meta_sha256"] != _meta_digest(meta):
        raise _corrupt(checkpoint, META, "does not match its checksum (the file was changed after it was written)")
    missing = [k for k in ("kind", "base_model", "rank", "alpha") if k not in meta]
    if missing:
        raise _corrupt(checkpoint, META, f"lacks {missing}")
    return meta


def is_full(meta: Dict[str, Any]) -> bool:
    """Whether a checkpoint holds every weight (full fine-tuning: rank 0), not an adapter."""
    return meta.get("rank") == 0


def weight_files(meta: Dict[str, Any]) -> List[str]:
    """The files a sampler reads: the whole model's, or the adapter's (of a sharded checkpoint,
    its DCP files: weights and optimizer state share them)."""
    if dcp_state.is_dcp(meta):
        return dcp_state.files(meta)
    return [WEIGHTS, MODEL_CONFIG] if is_full(meta) else [ADAPTER, ADAPTER_CONFIG]


def expected_files(meta: Dict[str, Any]) -> List[str]:
    """The files a checkpoint of this kind must hold besides its metadata."""
    if dcp_state.is_dcp(meta):
        return dcp_state.files(meta)
    return weight_files(meta) + ([OPTIMIZER] if meta.get("kind") == "state" else [])


def _file_record(checkpoint: str, meta: Dict[str, Any], name: str) -> Optional[Dict[str, Any]]:
    files = meta.get("files")
    if files is None:  # written before checksums: nothing to compare with
        return None
    if name not in files:
        raise _corrupt(checkpoint, META, f"records no checksum for {name}")
    return files[name]


def _check(checkpoint: str, name: str, size: int, digest: str, record: Optional[Dict[str, Any]]) -> None:
    if record is None:
        return
    if size != record["bytes"]:
        what = "is truncated" if size < record["bytes"] else "has grown"
        raise _corrupt(checkpoint, name, f"{what}: {size} bytes, {record['bytes']} when written")
    if digest != record["sha256"]:
        raise _corrupt(checkpoint, name, "does not match its SHA-256 checksum "
                       "(its content changed after it was written)")


def read_file(checkpoint: str, name: str, meta: Optional[Dict[str, Any]] = None) -> bytes:
    """The bytes of file ``name`` of a checkpoint, verified against its recorded size and checksum."""
    meta = meta if meta is not None else read_meta(checkpoint)
    record = _file_record(checkpoint, meta, name)
    path = resolve(checkpoint) / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _corrupt(checkpoint, name, "is missing") from None
    except OSError as exc:
        raise _corrupt(checkpoint, name, f"cannot be read ({exc.strerror or exc})") from None
    _check(checkpoint, name, len(data), hashlib.sha256(data).hexdigest(), record)
    return data


def verify(checkpoint: str, names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Check every file of a checkpoint (or only ``names``) against its record, streamed, nothing
    loaded; return the metadata. Raises :class:`CheckpointCorruptError` naming the first bad file."""
    meta = read_meta(checkpoint)
    root = resolve(checkpoint)
    if names is not None and tuple(names) == SAMPLER_FILES:
        names = weight_files(meta)
    names = sorted(names if names is not None else set(expected_files(meta)) | set(meta.get("files") or {}))
    for name in names:
        record = _file_record(checkpoint, meta, name)
        path = root / name
        if not path.is_file():
            raise _corrupt(checkpoint, name, "is missing")
        if record is None:
            continue
        digest, size = hashlib.sha256(), 0
        try:
            with open(path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as exc:
            raise _corrupt(checkpoint, name, f"cannot be read ({exc.strerror or exc})") from None
        _check(checkpoint, name, size, digest.hexdigest(), record)
    return meta


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_checkpoint(
    root: Path,
    name: str,
    *,
    peft_model: Any,
    optimizer: Optional[torch.optim.Optimizer],
    meta: Dict[str, Any],
    overwrite: bool = False,
) -> str:
    """Write a checkpoint directory ``root/name`` atomically, with the size and SHA-256 of every
    file in its metadata; return its id. ``peft_model`` is the session's model: a PEFT model
    writes its adapter, a plain ``transformers`` model (full fine-tuning) all its weights, in one file.

    On N ranks (:mod:`.distributed`, a collective) a checkpoint with an ``optimizer``
    (``save_state``) is DCP's sharded files, each rank writing its own shards (:mod:`.dcp_state`);
    one without (``save_weights_for_sampler``, the export) has every rank gather the whole weights
    and rank 0 alone write the files a single process would. Either loads on any number of ranks;
    every rank returns rank 0's id, or raises rank 0's error."""
    if not name or "/" in name or name.startswith("."):
        raise InvalidInputError(f"checkpoint name {name!r} must be a plain, non-hidden file name")
    if distributed.ranks() > 1 and optimizer is not None:
        return _write_sharded(root, name, peft_model, optimizer, meta, overwrite)
    if distributed.ranks() > 1:  # the export: whole weights, rank 0 writes
        state = distributed.full_state(peft_model.state_dict())
        return distributed.from_writer(lambda: _write(root, name, peft_model, state, None, meta, overwrite))
    return _write(root, name, peft_model, None, optimizer.state_dict() if optimizer is not None else None, meta, overwrite)


def _write_sharded(root: Path, name: str, model: Any, optimizer: torch.optim.Optimizer, meta: Dict[str, Any],
                   overwrite: bool) -> str:
    """:func:`write_checkpoint` on N ranks with an optimizer: rank 0 makes the temporary
    directory, every rank writes its DCP shards into it, rank 0 seals it (checksums, rename)."""
    tmp = Path(distributed.from_writer(lambda: str(_temporary(root, name, overwrite).resolve())))  # rank 0's, for all
    try:
        dcp_state.save(tmp, model, optimizer, is_full(meta))
    except BaseException:
        if distributed.is_writer():
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    sharded = {**meta, "format": dcp_state.FORMAT, "world_size": distributed.ranks()}
    return distributed.from_writer(lambda: _seal(root, name, tmp, sharded, overwrite))


def _temporary(root: Path, name: str, overwrite: bool) -> Path:
    """A new temporary sibling directory of checkpoint ``root/name`` (refused if that exists
    and ``overwrite`` is false)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.exists() and not overwrite:
        raise InvalidInputError(f"checkpoint {final} already exists (pass overwrite=True or another name)")
    return Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))


def _write(root: Path, name: str, peft_model: Any, state: Optional[Dict[str, torch.Tensor]],
           optimizer_state: Optional[Dict[str, Any]], meta: Dict[str, Any], overwrite: bool) -> str:
    """:func:`write_checkpoint`'s files (``state``: the model's whole state dict, else its own)."""
    extra = {} if state is None else {"state_dict": state}
    tmp = _temporary(root, name, overwrite)
    try:
        from rlkit.backends.local.models import quiet_loading

        with quiet_loading():  # no "Writing model shards" bar
            if is_full(meta):
                peft_model.save_pretrained(tmp, max_shard_size="1000GB", **extra)  # one WEIGHTS file, read whole
            else:
                peft_model.save_pretrained(tmp, **extra)
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _seal(root, name, tmp, meta, overwrite)


def _seal(root: Path, name: str, tmp: Path, meta: Dict[str, Any], overwrite: bool) -> str:
    """Record the size and SHA-256 of every file under ``tmp`` (by its relative path) in the
    metadata, sync, and rename ``tmp`` to ``root/name``; ``tmp`` is removed whatever happens."""
    final = root / name
    try:
        if final.exists() and not overwrite:
            raise InvalidInputError(f"checkpoint {final} already exists (pass overwrite=True or another name)")
        written = [f for f in sorted(tmp.rglob("*")) if f.is_file()]
        files = {f.relative_to(tmp).as_posix(): {"bytes": f.stat().st_size, "sha256": _sha256_file(f)} for f in written}
        body = {**meta, "created": time.time(), "files": files}
        body["meta_sha256"] = _meta_digest(body)
        (tmp / META).write_text(json.dumps(body, indent=2, sort_keys=True))
        for f in [*written, tmp / META]:
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        for d in [d for d in tmp.rglob("*") if d.is_dir()]:
            _fsync_dir(d)
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


def verify_sharded(checkpoint: str, meta: Dict[str, Any]) -> None:
    """Check every file of a sharded (DCP) checkpoint against its record: on N ranks each rank
    checks its share of the files and every rank raises the first failure (as
    :class:`~rlkit.errors.CheckpointCorruptError`), so nothing is loaded from a damaged checkpoint."""
    import torch.distributed as dist

    names = sorted({*expected_files(meta), *(meta.get("files") or {})})
    rank, ranks = (dist.get_rank(), dist.get_world_size()) if distributed.ranks() > 1 else (0, 1)
    problem: Optional[tuple] = None
    try:
        verify(checkpoint, names[rank::ranks])
    except (CheckpointCorruptError, CheckpointNotFoundError) as exc:
        problem = (type(exc), str(exc), getattr(exc, "file", None))
    if ranks > 1:
        problems: List[Any] = [None] * ranks
        dist.all_gather_object(problems, problem)
        problem = next((p for p in problems if p is not None), None)
    if problem is not None:
        kind, message, name = problem
        if kind is CheckpointCorruptError:
            raise CheckpointCorruptError(message, checkpoint=checkpoint, file=name)
        raise kind(message)


def load_adapter_tensors(checkpoint: str, meta: Optional[Dict[str, Any]] = None) -> Dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint, verified: PEFT's adapter keys, or of a full checkpoint
    the model's parameter names (as ``save_pretrained`` wrote them)."""
    from safetensors.torch import load

    meta = meta if meta is not None else read_meta(checkpoint)
    if dcp_state.is_dcp(meta):  # N ranks' shards: verified, then read whole in this process
        verify(checkpoint, dcp_state.files(meta))
        try:
            return dcp_state.read_weights(resolve(checkpoint), is_full(meta))
        except Exception as exc:  # noqa: BLE001 - DCP's CheckpointException, an unpickling error
            raise _corrupt(checkpoint, dcp_state.DCP_METADATA, f"cannot be read ({type(exc).__name__}: {exc})") from None
    name = WEIGHTS if is_full(meta) else ADAPTER
    data = read_file(checkpoint, name, meta)
    try:
        return load(data)
    except Exception as exc:  # noqa: BLE001 - SafetensorError and friends: the file is not a safetensors file
        raise _corrupt(checkpoint, name, f"cannot be parsed ({type(exc).__name__}: {exc})") from None


def sampler_weights(checkpoint: str) -> Any:
    """What the sampler merges for a checkpoint, verified: ``{path: (A, B, scale)}`` of an adapter,
    or every parameter of a full checkpoint (:class:`~.engine.FullWeights`)."""
    from rlkit.backends.local.engine import FullWeights

    meta = read_meta(checkpoint)
    tensors = load_adapter_tensors(checkpoint, meta)
    if is_full(meta):
        return FullWeights(tensors)
    return adapter_from_tensors(tensors, meta["alpha"] / meta["rank"])


def load_optimizer_state(checkpoint: str, meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The optimizer state of a ``save_state`` checkpoint, verified."""
    meta = meta if meta is not None else read_meta(checkpoint)
    if meta.get("kind") != "state":
        raise InvalidInputError(
            f"checkpoint {checkpoint!r} holds weights only (save_weights_for_sampler); "
            "load_state_with_optimizer needs a save_state checkpoint"
        )
    if dcp_state.is_dcp(meta):
        raise InvalidInputError(f"checkpoint {checkpoint!r} is sharded (DCP): load it into a session (dcp_state.load_into)")
    data = read_file(checkpoint, OPTIMIZER, meta)
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")  # load_state_dict moves it to the parameters' device
    except Exception as exc:  # noqa: BLE001 - a torn zip, an unpickling error
        raise _corrupt(checkpoint, OPTIMIZER, f"cannot be parsed ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or "state" not in state or "param_groups" not in state:
        raise _corrupt(checkpoint, OPTIMIZER, "is not an optimizer state dict")
    return state


def nonfinite_tensor(tensors: Dict[str, torch.Tensor]) -> Optional[str]:
    """The name of the first tensor holding NaN or inf (``None`` if all are finite)."""
    for key, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return key
    return None


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
