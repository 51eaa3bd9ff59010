"""The local engine on N ranks: FSDP2 (``torch.distributed.fsdp.fully_shard``) under ``torchrun``.

**SPMD.** Every rank runs the user's loop unchanged — the same ``rlkit.connect("local")``, the
same calls in the same order — and each rank's :class:`~.engine.TrainingEngine` finds the process
group ``torchrun`` describes (``WORLD_SIZE`` > 1; gloo on CPUs, NCCL with CUDA) and shards itself.
No driver, no operation stream: the session contract is the one-process one on every rank, and
every rank gets the same results (losses, logprobs, metrics, grad norms), so a loop's decisions
agree; each ``forward``/``forward_backward`` checks that every rank passed the same batch
(:func:`check_same_batch`). Rank 0 is the one that writes files (``is_writer``; ``rlkit train``
gives another rank a scratch copy of the run directory: :func:`rank_run_dir`).

**Sharding.** Each decoder layer is ``fully_shard``-ed (its frozen base weights and its LoRA
adapter, or in full fine-tuning all its weights: 1/N of each per rank, all-gathered for its forward
and backward, gradients reduce-scattered). The embeddings, final norm and output layer (tied) stay
replicated; in full fine-tuning their gradients are summed across ranks at ``optim_step``.
Gradient reduction is a **sum** (divide factor 1): the built-in losses are sums over tokens, so N
ranks each summing its share give the one-process gradient up to reduction order.

**The batch.** :func:`share` splits a ``forward_backward``/``forward`` batch across ranks by
tokens, whole groups at a time (datums sharing a prompt — :func:`~.batching.make_units` — go to
the same rank), contiguous in submission order. Each rank runs its share in micro-batches, each
micro-batch **one** decoder pass: a group's prompt and its members' completions packed into one row
with a block attention mask (:mod:`.packed`: the prompt computed once, as the one-process engine's
two-pass cache path does); every rank then runs as many micro-batches as the busiest one (idle ones run a
one-token pass with zero loss), because each layer's all-gather is a collective every rank must
join. The outputs and metrics of all ranks are gathered, so every rank returns the whole batch's.

**Checkpoints.** ``save_state`` writes ``torch.distributed.checkpoint``'s sharded files
(:mod:`.dcp_state`): each rank writes its own shards of the trainable weights and the optimizer
state (``get_state_dict``: the DTensors as they are, nothing gathered to rank 0) into a temporary
directory, and rank 0 records every file's SHA-256 and renames it into place (atomic, verified on
read, as every local checkpoint: :mod:`.checkpoints`). It loads on any number of ranks — DCP
reshards — or in one plain process (tested 2 -> 2, 2 -> 1, 2 -> 4: the same weights bit for bit, the
same next step). ``save_weights_for_sampler`` is the export (the adapter, or a ``from_pretrained``
directory): every rank gathers the whole weights and rank 0 writes them. A one-process checkpoint
loads on N ranks as it is, each rank keeping its shard (:func:`shard_like`, :func:`shard_optimizer_state`).

A loss over the whole batch at once (``datum_separable=False``, e.g. DPO's pairs) runs the whole
batch on every rank, each backpropagating ``loss / N``: the one-process gradient, no work split.

Rollouts are shared over the ranks, not run here: :mod:`rlkit.rl.rank_rollouts` (each rank a share
of the groups, every rank all of them).

**Activation checkpointing** (``backend.activation_checkpointing``, :mod:`.activations`) works as in
one process: the per-layer wrapper runs inside the FSDP2 module's call, so a checkpointed layer's
recomputation in backward runs after FSDP2's pre-backward all-gather, with the unsharded weights —
no extra collective, and each rank may checkpoint other layers (``auto`` decides per rank from its
share). Measured on 2 CPU ranks, SmolLM2-135M, 16 x 256 tokens: each rank's peak grows 2.7 GB in a
``forward_backward`` with every layer checkpointed vs 5.4 GB without, the same loss.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from rlkit.backends.local.batching import make_units, merge_metrics
from rlkit.backends.local.device import rank_cuda_index
from rlkit.errors import InvalidInputError
from rlkit.types import Datum

def world_size() -> int:
    """Ranks of this run: ``torchrun``'s ``WORLD_SIZE`` (1 outside it)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


#: ``backend.rank_timeout_s``'s default: how long a rank waits for the others in one collective
#: (torch's own default for gloo) before it raises, ending the run (a hung or stopped rank)
RANK_TIMEOUT_S = 1800.0
#: ``backend.dist_backend``: auto = gloo on CPUs, NCCL for CUDA tensors where CUDA is present
DIST_BACKENDS = ("auto", "gloo", "nccl")
#: the ``backend`` options that say how ranks run (read by ``rlkit train``), not session options
RANK_OPTIONS = ("nproc", "rank_timeout_s", "dist_backend")


def init(timeout_s: Optional[float] = None, dist_backend: str = "auto") -> Tuple[int, int]:
    """Join ``torchrun``'s process group (once: later calls return it as it is) and check that
    every rank runs the same rlkit and torch (:func:`check_versions`); return ``(rank, world size)``.
    ``(0, 1)`` outside ``torchrun``. ``timeout_s`` (default :data:`RANK_TIMEOUT_S`) bounds every
    collective: a rank that waits longer for the others raises, and the run ends. ``dist_backend``:
    ``auto`` (gloo, plus NCCL for CUDA tensors where CUDA is present), ``gloo``, or ``nccl`` (NCCL for
    CUDA tensors, gloo for the CPU ones; refused without CUDA)."""
    from datetime import timedelta

    if world_size() <= 1:
        return 0, 1
    if not dist.is_initialized():
        check_dist_backend(dist_backend)
        nccl = dist_backend == "nccl" or (dist_backend == "auto" and torch.cuda.is_available())
        if nccl:  # NCCL binds a rank to the current device: this rank's own (cuda:LOCAL_RANK)
            gpu = rank_cuda_index()
            if gpu >= torch.cuda.device_count():
                from rlkit.errors import ConfigError

                raise ConfigError(f"rank {gpu} of this node has no GPU of its own: the node has "
                                  f"{torch.cuda.device_count()} CUDA device(s); start at most that many ranks per node")
            torch.cuda.set_device(gpu)
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if nccl else "gloo",
                                timeout=timedelta(seconds=float(RANK_TIMEOUT_S if timeout_s is None else timeout_s)))
        check_versions()
    return dist.get_rank(), dist.get_world_size()


def check_dist_backend(dist_backend: str) -> None:
    """Refuse, in one line, a ``backend.dist_backend`` that is not one of :data:`DIST_BACKENDS`, or
    NCCL on a machine without CUDA."""
    from rlkit.errors import ConfigError

    if dist_backend not in DIST_BACKENDS:
        raise ConfigError(f"backend.dist_backend={dist_backend!r}: expected one of {', '.join(DIST_BACKENDS)}")
    if dist_backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError("backend.dist_backend=nccl: NCCL needs CUDA devices and this machine has none "
                          "(torch.cuda.is_available() is false); use backend.dist_backend=gloo (or auto)")


def versions() -> Dict[str, str]:
    """What every rank must run the same of."""
    from rlkit.version import __version__

    return {"rlkit": __version__, "torch": torch.__version__}


def check_versions() -> None:
    """Refuse, in one line on every rank, ranks that run different rlkit or torch versions (one
    ``all_gather_object`` at :func:`init`): their sharded layouts and losses could disagree silently."""
    from rlkit.errors import ConfigError

    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, versions())
    if any(v != gathered[0] for v in gathered):
        said = ", ".join(f"rank {r}: " + " ".join(f"{k} {v}" for k, v in found.items()) for r, found in enumerate(gathered))
        raise ConfigError(f"the ranks run different versions ({said}); install the same rlkit and torch on every node")


def rank_run_dir(run_dir: Any) -> Any:
    """Where this rank's ``rlkit train`` keeps its run: ``run_dir`` on rank 0 (or one process);
    on rank k a scratch copy of it as it was at launch (its records, so a resumed run resumes on
    every rank; not its checkpoints, which every rank reads where rank 0 wrote them), removed at
    exit — the same loop runs on every rank, only rank 0's files and console lines are the run's.
    The ranks meet (a barrier) after the copy, before rank 0 writes anything."""
    import atexit
    import hashlib
    import logging
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    if world_size() <= 1:
        return run_dir
    rank, _ = init()
    if rank == 0:
        dist.barrier()
        return run_dir
    tag = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    for stale in Path(tempfile.gettempdir()).glob(f"rlkit-rank*-{tag}-*"):  # a killed rank's (no exit hook ran)
        if not _alive(int(stale.name.rsplit("-", 1)[-1])):
            shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.gettempdir()) / f"rlkit-rank{rank}-{tag}-{os.getpid()}"
    try:
        if Path(run_dir).is_dir():
            shutil.copytree(run_dir, scratch, ignore=shutil.ignore_patterns(".lock", "checkpoints"))
    finally:
        dist.barrier()
    atexit.register(shutil.rmtree, scratch, True)
    sys.stdout = open(os.devnull, "w")  # rank 0 prints the run's lines; every rank's errors still reach stderr
    logging.getLogger("rlkit").setLevel(logging.WARNING)
    return type(run_dir)(scratch) if isinstance(run_dir, str) else scratch


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ranks_to_launch(cfg: Any) -> int:
    """How many ranks ``rlkit train`` must start itself: ``backend.nproc`` when above 1 and not
    already under ``torchrun``, else 0. Under ``torchrun`` it joins the process group now, with the
    config's ``backend.rank_timeout_s`` and ``backend.dist_backend`` (the version check included).
    A launch that cannot work is one line before anything loads: a count below 1, ``nproc`` or
    ``torchrun`` with a backend other than ``local``, more ranks than the node's CUDA devices
    (``backend.device`` cuda), NCCL without CUDA, another count than ``torchrun`` started. More CPU
    ranks than cores is allowed (the ranks share cores) with a warning."""
    import logging

    from rlkit.errors import ConfigError

    backend = cfg.get("backend") or {}
    nproc = backend.get("nproc", 1)
    if nproc is None:
        nproc = 1
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ConfigError(f"backend.nproc={nproc!r}: expected a whole number of ranks >= 1")
    name = backend.get("name")
    if name != "local" and (nproc > 1 or world_size() > 1):
        how = f"backend.nproc={nproc}" if nproc > 1 else f"torchrun's {world_size()} ranks"
        raise ConfigError(f"{how}: only backend=local trains on N ranks (backend={name} sizes itself); "
                          f"run backend={name} as one process")
    if nproc == 1 and world_size() <= 1:
        return 0
    timeout_s = backend.get("rank_timeout_s", RANK_TIMEOUT_S)
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
        raise ConfigError(f"backend.rank_timeout_s={timeout_s!r}: expected seconds > 0")
    dist_backend = str(backend.get("dist_backend") or "auto")
    check_dist_backend(dist_backend)
    if world_size() > 1:
        if nproc != 1 and world_size() != nproc:
            raise ConfigError(f"backend.nproc={nproc} but torchrun started {world_size()} ranks; drop backend.nproc under torchrun")
        init(timeout_s, dist_backend)
        return 0
    device = str(backend.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.startswith("cuda") and nproc > torch.cuda.device_count():
        raise ConfigError(f"backend.nproc={nproc}: this node has {torch.cuda.device_count()} CUDA device(s)")
    if device == "cpu" and nproc > (os.cpu_count() or 1):
        logging.getLogger("rlkit").warning("backend.nproc=%d on %d CPU cores: the ranks share cores (slower than fewer ranks)",
                                           nproc, os.cpu_count() or 1)
    return nproc


def launch(nproc: int, argv: Sequence[str], resume_hint: Optional[Callable[[], str]] = None) -> int:
    """``rlkit ARGV`` on ``nproc`` ranks of this node under torch's elastic agent; its exit code,
    after one line naming the rank that failed and why, and ``resume_hint()`` (:mod:`.ranks_launch`)."""
    from rlkit.backends.local.ranks_launch import launch as elastic

    return elastic(nproc, argv, resume_hint)


def is_writer() -> bool:
    """Whether this process writes files: rank 0, or the only process."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def ranks() -> int:
    """Ranks of the joined process group (1 when none)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def full_state(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A state dict with every sharded tensor whole (a collective: every rank, the same order):
    what ``save_weights_for_sampler`` exports (``save_state`` is DCP's shards, :mod:`.dcp_state`)."""
    return {k: full(v.detach()) for k, v in state.items()}


def shard_like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` (whole, the same on every rank) as ``param`` is laid out: this rank's shard of it
    as a DTensor, no communication; ``value`` itself for a replicated parameter."""
    if not is_sharded(param):
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(device=param.device_mesh.device_type, dtype=param.dtype), param.device_mesh,
                             param.placements, src_data_rank=None)


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict`` of a whole state (a one-process checkpoint loaded on N ranks):
    each sharded parameter's state tensors become its shards (``load_state_dict`` post-hook)."""
    for p, state in optimizer.state.items():
        for k, v in list(state.items()):
            if is_sharded(p) and torch.is_tensor(v) and not is_sharded(v) and v.dim() > 0:
                state[k] = shard_like(p, v)


def from_writer(write: Any) -> Any:
    """``write()`` on rank 0 only; every rank returns its result or raises its error."""
    box: List[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", write())
        except Exception as exc:  # noqa: BLE001 - handed to every rank, raised there
            box[0] = ("error", exc)
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def shard(layers: torch.nn.ModuleList) -> None:
    """``fully_shard`` each decoder layer, gradients summed (not averaged) across ranks."""
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
        layer.set_gradient_divide_factor(1.0)
        layer.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)


def is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (``t`` itself when replicated)."""
    return t.to_local() if is_sharded(t) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t`` on every rank (a collective for a sharded tensor)."""
    return t.full_tensor() if is_sharded(t) else t


def share(data: Sequence[Datum], ranks: int, min_shared: int) -> List[List[int]]:
    """Datum indices per rank: whole groups (datums sharing a prompt), contiguous, each rank about
    ``1/ranks`` of the tokens (a group goes to the rank its middle token falls in)."""
    units = sorted(make_units(data, min_shared), key=lambda u: min(u.indices))
    sizes = [sum(data[i].model_input.length for i in u.indices) for u in units]
    total = max(sum(sizes), 1)
    out: List[List[int]] = [[] for _ in range(ranks)]
    seen = 0
    for unit, size in zip(units, sizes):
        rank = min(ranks - 1, int((seen + size / 2) * ranks / total))
        out[rank] += sorted(unit.indices)
        seen += size
    return out


def run(engine: Any, data: Sequence[Datum], loss: Any, backward: bool) -> Any:
    """``engine.run`` on N ranks: this rank's share, every rank the same number of micro-batches,
    then every rank's outputs and metrics gathered (see the module docstring)."""
    from rlkit.types import ForwardBackwardOutput, TokenUsage

    rank, ranks = dist.get_rank(), dist.get_world_size()
    check_same_batch(data, "forward_backward" if backward else "forward")
    if not loss.datum_separable:  # the whole batch on every rank, each adding 1/N of the gradient
        engine.loss_scale = 1.0 / ranks
        try:
            return engine.run_local(data, loss, backward=backward)
        finally:
            engine.loss_scale = 1.0
    mine = share(data, ranks, engine.group_shared_prefix)[rank]
    part = [data[i] for i in mine]
    count = torch.tensor([len(engine.plan(part)) if part else 0])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    result = engine.run_local(part, loss, backward=backward, micro_batches=int(count))
    gathered: List[Any] = [None] * ranks
    dist.all_gather_object(gathered, (mine, [o["logprobs"] for o in result.loss_fn_outputs], result.metrics))
    outputs: List[Any] = [None] * len(data)
    metrics: Dict[str, float] = {}
    weights: Dict[str, float] = {}
    for indices, logprobs, part_metrics in gathered:
        for i, lp in zip(indices, logprobs):
            outputs[i] = {"logprobs": lp}
        merge_metrics(metrics, part_metrics, weights)
    n_tokens = sum(d.model_input.length for d in data)
    if backward:
        engine.pending_grad_tokens += n_tokens - sum(d.model_input.length for d in part)
    return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics, usage=TokenUsage(train_tokens=n_tokens))


#: the float loss inputs of the ranks' batches may differ by this much (relative, per datum and
#: key: rounding, e.g. sampler logprobs from decode batches composed differently on each rank)
SAME_BATCH_RTOL, SAME_BATCH_ATOL = 1e-4, 1e-5


def batch_digest(data: Sequence[Datum]) -> Tuple[str, List[float]]:
    """What :func:`check_same_batch` compares: a SHA-256 of the batch's tokens and integer loss
    inputs (exact), and for every datum and float loss input its sum and its sum of magnitudes
    (float64; compared within :data:`SAME_BATCH_RTOL`)."""
    import hashlib

    from rlkit.types import TensorData

    digest, sums = hashlib.sha256(), []
    for d in data:
        digest.update(torch.tensor(d.model_input.to_ints(), dtype=torch.long).numpy().tobytes())
        for key in sorted(d.loss_fn_inputs):
            digest.update(key.encode())
            raw = d.loss_fn_inputs[key]
            value = (raw.to_torch() if isinstance(raw, TensorData) else torch.as_tensor(raw)).reshape(-1)
            if value.dtype.is_floating_point:
                value = value.double()
                sums += [float(value.sum()), float(value.abs().sum())]
            else:
                digest.update(value.long().contiguous().numpy().tobytes())
    return digest.hexdigest(), sums


def _same_digest(a: Tuple[str, List[float]], b: Tuple[str, List[float]]) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(
        abs(x - y) <= SAME_BATCH_ATOL + SAME_BATCH_RTOL * max(abs(x), abs(y)) for x, y in zip(a[1], b[1]))


def check_same_batch(data: Sequence[Datum], where: str) -> None:
    """Refuse, in one line on every rank, a batch that is not the same on every rank (SPMD: the
    ranks' loops must agree; a loop whose rollouts differ per rank would otherwise train on a mix).
    Tokens and integer inputs must be equal; float inputs within rounding (:func:`batch_digest`):
    each rank then computes its share of the rows with its own values, which is one process's
    result within the same tolerance."""
    digests: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, batch_digest(data))
    differ = [r for r, d in enumerate(digests) if not _same_digest(d, digests[0])]
    if differ:
        raise InvalidInputError(f"{where}: rank(s) {differ} passed another batch than rank 0; on N ranks every rank's loop "
                                "must pass the same data (seed the sampling, or build the batch on rank 0 and broadcast it)")


def sum_replicated_grads(params: Sequence[torch.Tensor]) -> None:
    """Sum the gradients of the replicated (unsharded) trainable parameters across ranks."""
    for p in params:
        if not is_sharded(p) and p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def _norm(params: Sequence[torch.Tensor], replicated_summed: bool) -> float:
    """The L2 norm of all gradients (a collective): sharded ones' squares summed over ranks;
    replicated ones counted once — as they are once ``optim_step`` has summed them over ranks
    (``replicated_summed``), else summed over ranks on a copy first."""
    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is None:
            continue
        if is_sharded(p):
            sharded += local(p.grad).detach().double().pow(2).sum()
            continue
        whole = local(p.grad).detach().double()
        if not replicated_summed:
            whole = whole.clone()
            dist.all_reduce(whole, op=dist.ReduceOp.SUM)
        replicated += whole.pow(2).sum()
    dist.all_reduce(sharded, op=dist.ReduceOp.SUM)
    return float(torch.sqrt(sharded + replicated))


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> float:
    """The L2 norm of all gradients (replicated ones already summed over ranks), and the
    gradients scaled by ``max_norm / (norm + 1e-6)`` where that is below 1 (as
    ``torch.nn.utils.clip_grad_norm_``)."""
    norm = _norm(params, replicated_summed=True)
    coef = max_norm / (norm + 1e-6)
    if math.isfinite(norm) and coef < 1.0:
        for p in params:
            local(p.grad).mul_(coef)
    return norm


def grad_norm(params: Sequence[torch.Tensor]) -> float:
    """:func:`clip_grad_norm`'s norm between ``forward_backward`` and ``optim_step``, nothing
    changed: each replicated gradient is still each rank's own share there."""
    return _norm(params, replicated_summed=False)


def max_abs(tensors: Sequence[torch.Tensor]) -> float:
    """The largest ``|x|`` over ``tensors`` on every rank."""
    top = torch.zeros((), dtype=torch.float64)
    for t in tensors:
        part = local(t)
        if part.numel():
            top = torch.maximum(top, part.detach().abs().max().double())
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return float(top)


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite on every rank."""
    bad = torch.tensor([0 if all(bool(torch.isfinite(local(t)).all()) for t in tensors) else 1])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad)
