"""``save_state`` checkpoints on N ranks: ``torch.distributed.checkpoint`` (DCP) sharded files.

On N ranks (:mod:`.distributed`) a ``save_state`` checkpoint holds the training state — the
trainable weights (the LoRA adapter, or in full fine-tuning every weight) and the optimizer state —
as DCP writes it: ``dcp/.metadata`` plus one ``dcp/__<rank>_0.distcp`` per rank, each rank writing
its own shards (from ``get_state_dict``: FSDP2's DTensors as they are, nothing gathered; a
replicated tensor is written once). The checkpoint's metadata records ``"format": "dcp"`` and the
rank count it was saved on, beside what every checkpoint records (kind, base model, LoRA rank and
alpha — 0 for full fine-tuning — step).

**Atomic and checksummed as every local checkpoint** (:mod:`.checkpoints`): the ranks write into a
temporary sibling directory rank 0 made, meet (DCP's own closing collective), and rank 0 records
the size and SHA-256 of every file in ``rlkit_checkpoint.json`` and renames the directory into
place — a save killed on any rank leaves no checkpoint, only a hidden ``.<name>.tmp-*`` directory.
The checkpoint root must be one filesystem every rank sees (one node, or a shared mount).

**Loads on any number of ranks.** :func:`load_into` first verifies every file against its checksum
(on N ranks each rank checks 1/N of the files and all learn the first failure), then
``dcp.load`` reads each rank's part into ``get_state_dict``'s template of this session — the
resharding (2 ranks to 1, to 4) is DCP's — and ``set_state_dict`` puts it in. In one plain process
(no process group) the same calls read the whole tensors. :func:`read_weights` reads the whole
trainable weights in one process without a process group (what a sampler, ``rlkit serve`` or the
Tinker server merge), keyed as the one-process files are (PEFT's adapter keys, or the model's
parameter names).

``save_weights_for_sampler`` is not this format: it is the export (an adapter or a
``from_pretrained`` directory), gathered and written by rank 0 alone (:mod:`.checkpoints`).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List

import torch


FORMAT = "dcp"  # the metadata's "format" of a sharded checkpoint (absent: the one-process files)
DIR = "dcp"  # the DCP directory inside a checkpoint
DCP_METADATA = f"{DIR}/.metadata"


def is_dcp(meta: Dict[str, Any]) -> bool:
    """Whether a checkpoint's metadata says it holds DCP sharded files."""
    return meta.get("format") == FORMAT


def files(meta: Dict[str, Any]) -> List[str]:
    """The DCP files of a sharded checkpoint: its ``.metadata`` and every shard it recorded."""
    recorded = sorted(name for name in (meta.get("files") or {}) if name.startswith(f"{DIR}/"))
    return sorted({DCP_METADATA, *recorded})


def _options(full_finetune: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # LoRA: the adapter only (the frozen base is the base model's, not the checkpoint's); not
    # strict, as the frozen keys are absent by design: dcp.load refuses a trainable key the
    # checkpoint lacks (its planner loads no partial state dict)
    return StateDictOptions(ignore_frozen_params=not full_finetune, strict=False)


def _trainable(model: torch.nn.Module, model_sd: Dict[str, Any], full_finetune: bool) -> Dict[str, Any]:
    """``get_state_dict``'s model state without a LoRA session's frozen tied aliases (the output
    layer sharing the frozen embeddings survives ``ignore_frozen_params``): the adapter alone."""
    if full_finetune:
        return model_sd
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {key: value for key, value in model_sd.items() if key in trainable}


def save(directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, full_finetune: bool) -> None:
    """Every rank writes its shards of the trainable weights and the optimizer state into
    ``directory/dcp`` (a collective: every rank, the same call)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    fresh = not optimizer.state  # get_state_dict gives an empty optimizer state by a zero-gradient step (its step 1)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(full_finetune))
    dcp.save({"model": _trainable(model, model_sd, full_finetune), "optim": optim_sd}, checkpoint_id=str(Path(directory) / DIR))
    if fresh:  # so the session's next step is still Adam's first, as on one process (rlkit conformance local --nproc 2)
        optimizer.state.clear()


@contextlib.contextmanager
def _one_process_quiet() -> Iterator[None]:
    """No "assuming the intent is to load in a single process" warning: one process is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        yield


def load_into(engine: Any, directory: Path, with_optimizer: bool) -> None:
    """Read a verified sharded checkpoint (its resolved ``directory``) into ``engine`` (a collective on N ranks; any rank
    count, none at all in one process): its trainable weights, and with ``with_optimizer`` its
    optimizer state (else the optimizer state is cleared). Gradients are dropped first (the
    optimizer-state template DCP fills is made by one zero-gradient, zero-lr step)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = _options(engine.lora.full)
    engine.optimizer.zero_grad(set_to_none=True)
    if not with_optimizer:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        model_sd = _trainable(engine.model, get_model_state_dict(engine.model, options=options), engine.lora.full)
        with _one_process_quiet():
            dcp.load({"model": model_sd}, checkpoint_id=str(Path(directory) / DIR))
        set_model_state_dict(engine.model, model_sd, options=options)
        engine.optimizer.state.clear()
        return
    engine.optimizer.state.clear()  # a fresh template: every parameter's state, as the checkpoint's
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer, options=options)
    state = {"model": _trainable(engine.model, model_sd, engine.lora.full), "optim": optim_sd}
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=str(Path(directory) / DIR))
    set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)


def read_weights(directory: Path, full_finetune: bool) -> Dict[str, torch.Tensor]:
    """The whole trainable weights of a sharded checkpoint (its resolved ``directory``), read in this process alone (no
    collective, whatever the process group), keyed as the one-process files: PEFT's adapter keys
    (``...lora_A.weight``, the adapter's name dropped), or the model's parameter names. The files
    are not verified here: :func:`~.checkpoints.load_adapter_tensors` verifies them first."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    # as torch's own format_utils.dcp_to_torch_save reads a whole checkpoint (dcp.load would fill
    # a copy of an empty dict); no_dist: this process alone, never a collective
    state: Dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(Path(directory) / DIR)),
                     planner=_EmptyStateDictLoadPlanner(keys={"model"}), no_dist=True)
    weights = state.get("model") or {}
    if full_finetune:
        return dict(weights)
    return {key.replace(".default.", "."): value for key, value in weights.items()}
