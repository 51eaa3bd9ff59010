"""The local engine on N ranks behind one server: rank 0 leads, the other ranks follow its operations.

:mod:`.distributed` runs the local engine SPMD: every rank runs the same loop. A server cannot:
its requests (HTTP: ``rlkit serve tinker --nproc N``) arrive at rank 0 only, from several clients
and worker threads at once. So on N ranks the server's engine is a :class:`LeadService` on rank 0
and :func:`follow` on every other rank — the design of vLLM's multiprocess executor:

- **One ordered stream.** Every operation that touches the sharded engine (creating a training
  client, from scratch or from a checkpoint; ``forward``, ``forward_backward``, ``optim_step``;
  ``save_state``, ``save_weights_for_sampler``, ``save_weights_and_get_sampling_client``,
  ``load_state``/``load_state_with_optimizer``; stopping a client) goes through :meth:`OpStream.call`:
  under one lock, rank 0 broadcasts the operation (:class:`Op`: which client, which method, its
  arguments, pickled) on a dedicated gloo group, every rank executes it on its own engine and waits
  for its result, and every rank's outcome is gathered. So however many HTTP clients and worker
  threads rank 0 has, the ranks issue their collectives in one global order: one engine
  operation at a time, the next broadcast only after every rank finished the last.
- **Results from rank 0.** Rank 0's result is the answer (every rank computes the same: the engine
  gathers outputs and metrics, :mod:`.distributed`); a follower's is dropped. An operation that
  failed on some ranks and not on others is an error on rank 0 naming those ranks (the client it
  created, if any, is stopped on every rank).
- **Not broadcast: sampling.** The local sampler holds the whole model on every rank and issues no
  collective, so ``sample``/``compute_logprobs`` (and sampling clients on the base model or a
  checkpoint) run on rank 0 only, beside the stream; the followers' samplers stay idle.
  Weights for a sampler are gathered from the shards (a collective), so
  ``save_weights_and_get_sampling_client`` is in the stream (a follower drops its copy).
- **Lifetime.** :meth:`LeadService.close` sends the stream's end: each follower closes its engine and
  returns. A follower ignores SIGINT and SIGTERM (:func:`quiet_follower`): it ends when rank 0 says
  so, so Ctrl-C or SIGTERM stops the server cleanly through rank 0. A rank that dies ends the server: ``torchrun``'s agent stops every rank when one exits (and a
  collective with a dead peer fails on the ranks still in it). The stream's group waits
  :data:`IDLE_TIMEOUT` for rank 0's next operation, so an idle server's followers do not time out.

Launching (:func:`ranks_for`, :func:`relaunch_argv`): ``--nproc N`` outside ``torchrun`` starts
torch's elastic agent with the same command (as ``rlkit train ... backend.nproc=N``); under
``torchrun --nproc-per-node N -m rlkit ...`` the command runs as it is, one process per rank.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence

import torch.distributed as dist

from rlkit.backends.local import distributed
from rlkit.errors import ConfigError, OperationError
from rlkit.futures import APIFuture

log = logging.getLogger(__name__)

#: how long a follower waits for rank 0's next operation (an idle server's followers wait this long)
IDLE_TIMEOUT = timedelta(days=365)


def ranks_for(nproc: Optional[int], where: str, *, local: bool = True) -> int:
    """The ranks a command's ``--nproc`` asks for, checked before anything loads (one line, exit 2):
    a whole number >= 1, on the local engine only (``local``), under ``torchrun`` the count it
    started. 0: this process must start them itself (:func:`relaunch_argv` and
    :func:`~.distributed.launch`); else the ranks this process is one of (1 outside torchrun)."""
    started = distributed.world_size()
    if nproc is None:
        return started
    if nproc < 1:
        raise ConfigError(f"{where}: --nproc {nproc}: expected a whole number of ranks >= 1")
    if not local and nproc != 1:
        raise ConfigError(f"{where}: --nproc {nproc}: only the local engine runs on N ranks (this engine sizes itself)")
    if started > 1 and started != nproc:
        raise ConfigError(f"{where}: --nproc {nproc} but torchrun started {started} ranks; drop --nproc under torchrun")
    if started == 1 and nproc > 1:
        try:  # more ranks than this node's CUDA devices: the rule rlkit train's backend.nproc follows
            distributed.ranks_to_launch({"backend": {"name": "local", "nproc": nproc}})
        except ConfigError as exc:
            raise ConfigError(f"{where}: {str(exc).replace(f'backend.nproc={nproc}', f'--nproc {nproc}')}") from None
        return 0
    return started


def relaunch_argv(argv: Sequence[str]) -> List[str]:
    """``argv`` without its ``--nproc N`` / ``--nproc=N``: what the ranks the command starts run
    (under the elastic agent, which sets their count; ``torchrun``'s own parser would also take
    ``--nproc`` for its ``--nproc-per-node``)."""
    out: List[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def quiet_follower(follows: bool = True) -> None:
    """A rank other than 0: no stdout (rank 0 prints), rlkit's log at warnings; its errors still
    reach stderr. ``follows`` (a server's follower): SIGINT and SIGTERM ignored (the process group's
    Ctrl-C, the agent's stop: it ends when rank 0 ends the stream, or when rank 0 is gone — its
    pending collective then fails — or by the agent's SIGKILL)."""
    import os
    import signal
    import sys

    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - this rank's stdout for the rest of its life
    logging.getLogger("rlkit").setLevel(logging.WARNING)
    if follows:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


@dataclass(frozen=True)
class Op:
    """One engine operation of the stream: ``method`` of the service (``handle`` None) or of the
    client an earlier operation created; ``creates``: the handle its result becomes."""

    handle: Optional[int]
    method: str
    args: tuple = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)
    creates: Optional[int] = None


def execute(service: Any, handles: Dict[int, Any], op: Op) -> Any:
    """``op`` on this rank's engine, waited for (its future's result)."""
    target = service if op.handle is None else handles[op.handle]
    out = getattr(target, op.method)(*op.args, **op.kwargs)
    if isinstance(out, APIFuture):
        out = out.result()
    if op.creates is not None:
        handles[op.creates] = out
    if op.method == "stop":
        handles.pop(op.handle, None)
    return out


class OpStream:
    """The ordered operation stream of one server's ranks (module docstring); every rank makes one,
    at the same point (it creates a process group)."""

    def __init__(self) -> None:
        self.rank, self.ranks = distributed.init()
        self.group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        self.lock = threading.Lock()
        self.handles: Dict[int, Any] = {}
        self._ids = itertools.count(1)
        self.ended = False

    def _broadcast(self, value: Any = None) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _run(self, service: Any, op: Op) -> tuple:
        """Execute ``op`` here, then gather every rank's outcome: ``(value, error, differing ranks)``."""
        value, error, line = None, None, None
        try:
            value = execute(service, self.handles, op)
        except Exception as exc:  # noqa: BLE001 - rank 0 raises it; a follower's is compared
            error, line = exc, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        outcomes: List[Any] = [None] * self.ranks
        dist.all_gather_object(outcomes, line, group=self.group)
        differ = [r for r, o in enumerate(outcomes) if (o is None) != (line is None)]
        if differ and op.creates is not None and op.creates in self.handles:
            self.handles.pop(op.creates).stop()
        return value, error, (differ, outcomes)

    # -- rank 0 -------------------------------------------------------------------------------------
    def call(self, service: Any, op: Op) -> Any:
        """Rank 0: ``op`` on every rank, in the stream's one order; rank 0's result."""
        with self.lock:
            if self.ended:
                raise OperationError(f"{op.method}: the engine's ranks have stopped (the server is stopping)")
            self._broadcast(op)
            value, error, (differ, outcomes) = self._run(service, op)
        if differ:
            why = "; ".join(f"rank {r}: {outcomes[r] or 'succeeded'}" for r in differ)
            raise OperationError(f"{op.method}: the ranks disagree (rank 0: {outcomes[0] or 'succeeded'}; {why})")
        if error is not None:
            raise error
        return value

    def new_handle(self) -> int:
        return next(self._ids)

    def end(self) -> None:
        """Rank 0: the stream's end (each follower closes its engine and returns); once."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            try:
                self._broadcast(None)
            except Exception as exc:  # noqa: BLE001 - a follower already gone (torchrun is ending the ranks)
                log.warning("the engine's other ranks did not take the stop: %s", exc)

    # -- ranks 1..N-1 -------------------------------------------------------------------------------
    def follow(self, service: Any) -> None:
        """A follower: execute rank 0's operations in its order until the stream's end."""
        while True:
            op = self._broadcast()
            if op is None:
                return
            self._run(service, op)


def _done(value: Any, operation: str) -> APIFuture:
    future: APIFuture = APIFuture(operation=operation)
    future.set_result(value)
    return future


class LeadTrainer:
    """Rank 0's training client on N ranks: each operation runs on every rank through the stream
    (already done when its future is returned: the stream runs one operation at a time)."""

    def __init__(self, service: "LeadService", handle: int, local: Any):
        self._service = service
        self.handle = handle
        self.local = local  # rank 0's own client of the sharded engine
        self.name = local.name
        self.base_model = local.base_model

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._service.stream.call(self._service.local, Op(self.handle, method, args, kwargs))

    def forward(self, data: Any, loss_fn: Any = "cross_entropy", loss_fn_config: Any = None) -> APIFuture:
        return _done(self._call("forward", data, loss_fn, loss_fn_config), "forward")

    def forward_backward(self, data: Any, loss_fn: Any = "cross_entropy", loss_fn_config: Any = None) -> APIFuture:
        return _done(self._call("forward_backward", data, loss_fn, loss_fn_config), "forward_backward")

    def optim_step(self, params: Any) -> APIFuture:
        return _done(self._call("optim_step", params), "optim_step")

    def save_state(self, *args: Any, **kwargs: Any) -> APIFuture:
        return _done(self._call("save_state", *args, **kwargs), "save_state")

    def save_weights_for_sampler(self, *args: Any, **kwargs: Any) -> APIFuture:
        return _done(self._call("save_weights_for_sampler", *args, **kwargs), "save_weights_for_sampler")

    def save_weights_and_get_sampling_client(self, *args: Any, **kwargs: Any) -> Any:
        """Rank 0's sampling client on the gathered weights (the followers drop theirs)."""
        return self._call("save_weights_and_get_sampling_client", *args, **kwargs)

    def load_state(self, checkpoint: str) -> APIFuture:
        return _done(self._call("load_state", checkpoint), "load_state")

    def load_state_with_optimizer(self, checkpoint: str) -> APIFuture:
        return _done(self._call("load_state_with_optimizer", checkpoint), "load_state_with_optimizer")

    def stop(self) -> None:
        """Stop this client on every rank (rank 0 alone once the stream has ended)."""
        if self._service.stream.ended:
            self.local.stop()
            return
        self._call("stop")


class LeadService:
    """Rank 0's local service on N ranks: training clients through the stream (:class:`LeadTrainer`),
    sampling clients on rank 0 alone (module docstring)."""

    def __init__(self, local: Any, stream: OpStream):
        self.local = local
        self.stream = stream

    def _create(self, method: str, *args: Any, **kwargs: Any) -> LeadTrainer:
        handle = self.stream.new_handle()
        trainer = self.stream.call(self.local, Op(None, method, args, kwargs, creates=handle))
        return LeadTrainer(self, handle, trainer)

    def create_lora_training_client(self, *args: Any, **kwargs: Any) -> LeadTrainer:
        return self._create("create_lora_training_client", *args, **kwargs)

    def create_training_client_from_state(self, *args: Any, **kwargs: Any) -> LeadTrainer:
        return self._create("create_training_client_from_state", *args, **kwargs)

    def create_training_client_from_state_with_optimizer(self, *args: Any, **kwargs: Any) -> LeadTrainer:
        return self._create("create_training_client_from_state_with_optimizer", *args, **kwargs)

    def create_sampling_client(self, **kwargs: Any) -> Any:
        return self.local.create_sampling_client(**kwargs)

    def get_tokenizer(self, base_model: str) -> Any:
        return self.local.get_tokenizer(base_model)

    def close(self) -> None:
        """End the stream (every follower closes its engine), then close rank 0's."""
        self.stream.end()
        self.local.close()


def local_service(**options: Any) -> Any:
    """The server's engine: a :class:`~.clients.LocalServiceClient` with ``options``, or on rank 0
    of N ranks a :class:`LeadService` over one (the followers, in :func:`follow`, build theirs with
    the same ``options``, sent to them here)."""
    from rlkit.backends.local.clients import LocalServiceClient

    if distributed.world_size() <= 1:
        return LocalServiceClient(**options)
    stream = OpStream()
    if stream.rank != 0:
        raise OperationError("local_service() is rank 0's; the other ranks call follow()")
    stream._broadcast(options)
    return LeadService(LocalServiceClient(**options), stream)


def follow() -> int:
    """A rank other than 0 of a server on N ranks: build the engine rank 0 describes, execute its
    operations in its order until it ends the stream, close the engine; 0."""
    from rlkit.backends.local.clients import LocalServiceClient

    stream = OpStream()
    options = stream._broadcast()
    service = LocalServiceClient(**options)
    try:
        stream.follow(service)
    finally:
        service.close()
    return 0
