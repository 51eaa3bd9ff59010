"""Many runs, one pass: a scheduler that fuses different sessions' ``forward``/``forward_backward``.

One :class:`FusingWorker` per base model (``LocalServiceClient(fuse_runs=True)``) serves every
training session of that model from one thread; each session submits through its own
:class:`Lane` (the :class:`~.workers.OrderedWorker` interface: ``submit``, ``cancel_pending``,
``close``). The rules:

- **Order.** A session's operations run strictly in its own submission order: a pass only ever
  takes the *first* queued operation of a lane (its head).
- **Fairness.** Lanes with queued work are served round-robin: each pass has a *leader*, the head
  of the next lane (in creation order, after the previous leader) that has work. So once an
  operation is the head of its lane, at most one pass led by each other lane runs before it (a
  busy session cannot starve a quiet one, whatever it queued first). :attr:`FusingWorker.recent`
  records each pass (leader and members) for tests and benchmarks.
- **What fuses.** When the leader is a fusable op — ``forward`` or ``forward_backward`` with a
  built-in, datum-separable loss, of a LoRA session on one rank at the worker's precision — the
  heads of the other lanes that are fusable ops of the same kind join it, in round-robin order,
  while the pass holds at most ``max_pass_tokens`` datum tokens (the leader always runs). The
  members run as ONE pass through :func:`~.multi_lora.fused_run`, whose micro-batches keep the
  engine's ``micro_batch_tokens`` bound (memory is bounded as for one session) and whose packed
  rows run a GRPO group's shared prompt once, as the run's own engine does. An op whose groups'
  completions are long enough that a packed row costs more than two passes (:mod:`.layout`) is
  not fusable: it runs alone, in its engine's two passes. Everything else
  (``optim_step``, checkpoints, full fine-tuning, custom losses, a lone op) runs alone, as on an
  :class:`~.workers.OrderedWorker`.
- **Admission window.** A fusable leader waits for its *peers* — the other live sessions whose
  last fusable op was the same kind and ran within one of the leader's periods (the time since its
  own previous one) before its previous one: the same loop, e.g. N clients each doing
  ``forward_backward`` then ``optim_step`` — until every peer's op has joined (or has something
  else queued first) or the window ends: ``max(window_s, WAIT_FRACTION x the last pass of that
  kind)``. A session without peers never waits; one whose peers stopped coming waits at most a
  tenth of a pass. Measured (docs/tinker.md, "Many runs, one pass"): 4 tinker SDK clients'
  ``forward_backward`` requests in lockstep reach a SmolLM2 server's worker up to ~0.1 s apart
  (the HTTP handlers share 2 cores with the running pass), so the earlier fixed 20 ms window,
  which also stopped at the first partner, split them into passes of 1+3 or 2+2; waiting for the
  peers puts all four in one pass.
- **Isolation.** A run whose loss fails (bad inputs, a non-finite value) gets its own error and
  its gradients and token count are put back as they were before the pass (what its engine's own
  ``forward_backward`` leaves); the others' results and gradients are those of the pass. A failure
  of the pass itself (out of memory) restores every member and runs each alone, so only the one
  that fails alone fails.
- **Numbers.** A run's logprobs, losses and gradients equal its numbers alone within the tolerance
  :mod:`.multi_lora` states (fp32: logprobs 1e-5, gradients 1e-4 relative).
- **Stopping.** Cancellation, draining and the interpreter-exit rules are :class:`~.workers._Worker`'s
  (this worker is one: :func:`~.workers.shutdown_all` drains or cancels it like the others);
  :meth:`Lane.close` waits for that lane's queued work only, then detaches its adapter.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import torch

from rlkit.backends.local import workers
from rlkit.backends.local.engine import TrainingEngine
from rlkit.backends.local.multi_lora import MultiLoraModel, RunWork, fused_run
from rlkit.futures import APIFuture
from rlkit.losses.base import Loss
from rlkit.types import Datum

#: the admission window's floor (seconds) and its share of the last pass of the kind: see the
#: module docstring
WINDOW_S = 0.02
WAIT_FRACTION = 0.1
#: passes kept in :attr:`FusingWorker.recent`
RECENT = 256
@dataclass
class FusableOp:
    """What a fused pass needs of one ``forward`` (``backward`` False) or ``forward_backward``."""

    backward: bool
    data: List[Datum]
    loss: Loss

    @property
    def tokens(self) -> int:
        return sum(d.model_input.length for d in self.data)


@dataclass
class _Item:
    lane: "Lane"
    fn: Callable[[], Any]
    future: APIFuture
    fuse: Optional[FusableOp] = None
    queued_at: float = field(default_factory=time.monotonic)


@dataclass
class PassRecord:
    """One pass: the leader's lane, every member's ``(lane name, operation)``, fused or not, the
    seconds between its members' submissions (first to last; how far apart they arrived), and the
    pass's own seconds."""

    leader: str
    members: List[Tuple[str, str]]
    fused: bool
    spread_s: float = 0.0
    seconds: float = 0.0


@dataclass
class FusionStats:
    passes: int = 0
    fused_passes: int = 0  # passes of two or more runs through fused_run
    fused_ops: int = 0  # operations that ran in a fused pass
    waits: List[float] = field(default_factory=list)  # seconds a leader waited for its first partner (last RECENT)


class Lane:
    """One session's ordered queue on a :class:`FusingWorker` (the OrderedWorker interface)."""

    def __init__(self, worker: "FusingWorker", name: str, engine: TrainingEngine, seq: int):
        self.worker = worker
        self.name = name
        self.engine = engine
        self.seq = seq
        self.key = f"{name}#{seq}"  # the adapter's key in the fused model (a name can be reused)
        self.closed = False
        self.attached = False
        self.last_kind: Optional[bool] = None  # the kind of this lane's last fusable op served (backward or not)
        self.last_served = 0.0  # when that op's pass started (time.monotonic())

    @property
    def fusable(self) -> bool:
        """LoRA on one rank at the worker's precision: the engines :func:`fused_run` can route."""
        e = self.engine
        return not e.lora.full and e.world_size == 1 and e.precision == self.worker.precision

    def submit(self, fn: Callable[[], Any], *, operation: str, fuse: Optional[FusableOp] = None) -> APIFuture:
        """Queue ``fn`` behind this lane's earlier work; ``fuse`` says it may run in a fused pass
        (``fn`` is then what runs it alone)."""
        future: APIFuture = APIFuture(operation=operation)
        if fuse is not None and not (self.fusable and self.engine.packed_pays(fuse.data)):
            fuse = None  # runs alone: this engine can't be routed, or its groups run faster in two passes (.layout)
        self.worker._put(_Item(self, fn, future, fuse))
        return future

    def cancel_pending(self) -> int:
        """Cancel this lane's queued operations (the running one finishes); return how many."""
        with self.worker._ready:
            mine = [it for it in self.worker._items if isinstance(it, _Item) and it.lane is self]
        return sum(1 for it in mine if it.future.cancel())

    def close(self, wait: bool = True, *, cancel: bool = False) -> None:
        """Finish (``cancel``: skip) this lane's queued work, then detach its adapter."""
        if cancel:
            self.cancel_pending()
        if self.closed:
            return
        self.closed = True
        barrier = self.submit(self.worker._detach_fn(self), operation="stop")
        if not wait or not self.worker.alive or threading.current_thread() is self.worker._thread:
            return
        try:
            while not barrier.done() and self.worker.alive:  # polled, like _Worker.join
                time.sleep(0.01)
        except KeyboardInterrupt:
            workers._interrupted.set()
            self.cancel_pending()
            raise


class FusingWorker(workers._Worker):
    """The one training thread of a base model's sessions (see the module docstring)."""

    def __init__(self, base_model: torch.nn.Module, *, precision: str, device: torch.device, activation_checkpointing: Any,
                 micro_batch_tokens: int, window_s: float = WINDOW_S, max_pass_tokens: Optional[int] = None):
        self._base = base_model
        self.precision = precision
        self.device = device
        self.activation_checkpointing = activation_checkpointing
        self.micro_batch_tokens = int(micro_batch_tokens)
        self.window_s = float(window_s)
        self.max_pass_tokens = int(max_pass_tokens) if max_pass_tokens else 16 * self.micro_batch_tokens
        self.model: Optional[MultiLoraModel] = None  # built on the worker thread at the first fused pass
        self.stats = FusionStats()
        self.recent: Deque[PassRecord] = collections.deque(maxlen=RECENT)
        self._lanes = 0
        self._known: Dict[int, Lane] = {}  # open lanes by sequence number
        self._leader_seq = -1
        self._pass_s: Dict[bool, float] = {}  # seconds of the last pass of each kind (backward or not)
        self._seq_lock = threading.Lock()
        super().__init__("rlkit-train-fused")

    def lane(self, name: str, engine: TrainingEngine) -> Lane:
        with self._seq_lock:
            self._lanes += 1
            lane = self._known[self._lanes] = Lane(self, name, engine, self._lanes)
            return lane

    # -- choosing the next pass (called with self._ready held) -------------------------------------
    def _heads(self) -> Dict["Lane", _Item]:
        """The first queued item of each lane, before any stop marker, in queue order."""
        heads: Dict[Lane, _Item] = {}
        for it in self._items:
            if it is workers._STOP:
                break
            heads.setdefault(it.lane, it)
        return heads

    def _rotation(self, lanes: List["Lane"], after: int) -> List["Lane"]:
        """``lanes`` in round-robin order: sequence numbers after ``after`` first, then the rest."""
        return sorted(lanes, key=lambda lane: (lane.seq <= after, lane.seq))

    def _select(self) -> Any:
        heads = self._heads()
        if not heads:
            return self._items.popleft() if self._items else None  # the stop marker, or nothing
        leader = heads[self._rotation(list(heads), self._leader_seq)[0]]
        self._items.remove(leader)
        self._leader_seq = leader.lane.seq
        return leader

    def _get_nowait(self) -> Any:
        with self._ready:
            return self._select()

    def _get(self) -> Any:
        with self._ready:
            while True:
                item = self._select()
                if item is not None:
                    return item
                self._ready.wait()

    def _partners(self, leader: _Item, members: List[_Item]) -> List[_Item]:
        """Take the heads of lanes not yet in the pass (``members``, the leader first) that can join
        it (called with the lock). One op per lane a pass: a member's next op waits for the next."""
        taken: List[_Item] = []
        heads = self._heads()
        tokens, inside = sum(it.fuse.tokens for it in members), {it.lane for it in members}
        for lane in self._rotation([lane for lane in heads if lane not in inside], leader.lane.seq):
            it = heads[lane]
            if it.fuse is None or it.fuse.backward != leader.fuse.backward or it.future.cancel_requested:
                continue
            if tokens + it.fuse.tokens > self.max_pass_tokens:
                continue
            self._items.remove(it)
            taken.append(it)
            tokens += it.fuse.tokens
        return taken

    def _peers(self, leader: _Item) -> List["Lane"]:
        """The other open lanes in the leader's loop, the partners worth waiting for: those whose
        last fusable op was of this kind and ran at most one of the leader's periods (the time since
        its own previous one) before the leader's previous one (any time, at the leader's first)."""
        kind, mine = leader.fuse.backward, leader.lane
        since = 2 * mine.last_served - time.monotonic() if mine.last_kind is not None else float("-inf")
        return [lane for lane in list(self._known.values())
                if lane is not mine and not lane.closed and lane.last_kind == kind and lane.last_served >= since]

    def _window(self, leader: _Item) -> float:
        """How long ``leader`` may wait for its peers (seconds; see the module docstring)."""
        if self.window_s <= 0:
            return 0.0
        return max(self.window_s, WAIT_FRACTION * self._pass_s.get(leader.fuse.backward, 0.0))

    # -- serving ----------------------------------------------------------------------------------
    def _serve(self, leader: _Item) -> None:
        members = [leader]
        if leader.fuse is not None and not leader.future.cancel_requested and not workers._abandoned.is_set():
            with self._ready:
                members += self._partners(leader, members)
                peers = set(self._peers(leader))
                # a peer is still expected while it has nothing queued: a queued head that did not
                # join (another kind, over the token budget) must run first, and only this thread runs it
                missing = lambda: peers - {it.lane for it in members} - set(self._heads())  # noqa: E731
                if missing() and (window := self._window(leader)) > 0:
                    start = time.monotonic()
                    deadline = start + window
                    while missing() and (left := deadline - time.monotonic()) > 0:
                        self._ready.wait(left)
                        members += self._partners(leader, members)
                    if len(members) > 1:
                        self.stats.waits = (self.stats.waits + [time.monotonic() - start])[-RECENT:]
        self.stats.passes += 1
        arrivals = [it.queued_at for it in members]
        record = PassRecord(leader.lane.name, [(it.lane.name, it.future.operation) for it in members], len(members) > 1,
                            max(arrivals) - min(arrivals))
        self.recent.append(record)
        started = time.monotonic()
        if len(members) == 1:
            self._run_alone(leader)
        else:
            self._run_fused(members)
        record.seconds = time.monotonic() - started
        if leader.fuse is not None:
            self._pass_s[leader.fuse.backward] = record.seconds
        for it in members:
            if it.fuse is not None:
                it.lane.last_kind, it.lane.last_served = it.fuse.backward, started

    @staticmethod
    def _run_alone(item: _Item) -> None:
        """As :class:`~.workers.OrderedWorker` serves an item."""
        if workers._abandoned.is_set():
            item.future.cancel()
        if not item.future.set_running():  # cancelled while queued
            return
        try:
            item.future.set_result(item.fn())
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            item.future.set_exception(exc)

    def _run_fused(self, members: List[_Item]) -> None:
        live = [it for it in members if it.future.set_running()]  # cancelled ones are skipped
        if len(live) < 2:
            for it in live:
                self._run_item(it)
            return
        backward = live[0].fuse.backward
        saved = [_snapshot(it.lane.engine) for it in live] if backward else []
        try:
            model = self._fused_model(live)
            results = fused_run(model, [RunWork(it.lane.key, it.fuse.data, it.fuse.loss, it.lane.engine.min_shared_prefix) for it in live],
                                backward=backward, micro_batch_tokens=self.micro_batch_tokens)
        except Exception:  # noqa: BLE001 - the pass itself failed (out of memory): each alone, so only its own fails
            for it, state in zip(live, saved):
                _restore(it.lane.engine, state)
            for it in live:
                self._run_item(it)
            return
        except BaseException as exc:  # noqa: BLE001 - an interrupt: every member gets it
            for it, state in zip(live, saved):
                _restore(it.lane.engine, state)
            for it in live:
                it.future.set_exception(exc)
            return
        self.stats.fused_passes += 1
        self.stats.fused_ops += len(live)
        for k, (it, result) in enumerate(zip(live, results)):
            if isinstance(result, BaseException):
                if backward:
                    _restore(it.lane.engine, saved[k])
                it.future.set_exception(result)
            else:
                it.future.set_result(result)

    @staticmethod
    def _run_item(item: _Item) -> None:
        """Run an item already marked running, alone."""
        try:
            item.future.set_result(item.fn())
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            item.future.set_exception(exc)

    def _fused_model(self, live: List[_Item]) -> MultiLoraModel:
        if self.model is None:
            self.model = MultiLoraModel(self._base, precision=self.precision, device=self.device,
                                        activation_checkpointing=self.activation_checkpointing)
        for it in live:
            if not it.lane.attached:
                self.model.attach(it.lane.key, it.lane.engine)
                it.lane.attached = True
        return self.model

    def _detach_fn(self, lane: Lane) -> Callable[[], None]:
        def detach() -> None:  # runs on the worker thread, between passes
            if lane.attached and self.model is not None:
                self.model.remove_adapter(lane.key)
                lane.attached = False
            self._known.pop(lane.seq, None)

        return detach

    @staticmethod
    def _future_of(item: Any) -> APIFuture:
        return item.future


def _snapshot(engine: TrainingEngine) -> Tuple[List[Optional[torch.Tensor]], int]:
    return [None if p.grad is None else p.grad.clone() for _, p in engine.named_trainable], engine.pending_grad_tokens


def _restore(engine: TrainingEngine, state: Tuple[List[Optional[torch.Tensor]], int]) -> None:
    """Put a run's gradients and token count back as they were before a pass."""
    grads, tokens = state
    for (_, p), g in zip(engine.named_trainable, grads):
        p.grad = g
    engine.pending_grad_tokens = tokens
