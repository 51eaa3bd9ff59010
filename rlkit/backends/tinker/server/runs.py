"""A Tinker training run: a local training client fed in ``seq_id`` order by one worker thread.

Every operation's future resolves: with the operation's result, its one-line error (whatever it
raised), or — when the run ends first (its session finished or expired, or the server stopped) —
a one-line "cancelled" error for each operation still queued or waiting for a predecessor. The
operation running when the run ends finishes; then the worker releases the engine's client.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from rlkit.backends.tinker.server.records import Future, TinkerError, _iso, _one_line, digest
from rlkit.errors import RlkitError


class RunHost(Protocol):
    """What a run needs from the server's state (:class:`~.state.ServerState` is one)."""

    stats: Dict[str, int]

    def new_future(self, owner: Any = ...) -> Future: ...

    def release_sampler(self, sampler_id: str, reason: str) -> None: ...

    def checkpoints_of(self, model_id: str) -> List[Any]: ...

KEPT_EPHEMERAL_SAMPLERS = 16  # in-memory sampler weights kept per training run


class Run:
    """A training run: a local training client fed in ``seq_id`` order by one worker thread."""

    def __init__(
        self,
        state: RunHost,
        model_id: str,
        session_id: str,
        base_model: str,
        local_model: str,
        trainer: Any,
        rank: int,
        lora: Dict[str, Any],
        user_metadata: Optional[Dict[str, Any]],
        next_seq: int = 1,
        owner: Optional[str] = None,
    ):
        self.state = state
        self.model_id = model_id
        self.session_id = session_id
        self.owner = owner
        self.base_model = base_model
        self.local_model = local_model
        self.trainer = trainer
        self.rank = rank
        self.lora = lora
        self.user_metadata = user_metadata
        self.next_seq = next_seq
        self.seen: Dict[int, Tuple[str, str]] = {}  # seq_id -> (request_id, digest of its body)
        self.waiting: Dict[int, Tuple[Future, Callable[[], Any]]] = {}
        self.executed: List[int] = []
        self.ephemeral: collections.deque = collections.deque()
        self.last_request = time.time()
        self.lock = threading.Lock()
        self._queue: "collections.deque[Tuple[int, Future, Callable[[], Any]]]" = collections.deque()
        self._wake = threading.Condition(self.lock)
        self._closed: Optional[str] = None  # why the run ended
        self._thread = threading.Thread(target=self._work, name=f"tinker-run-{model_id}", daemon=True)
        self._thread.start()

    def submit(self, seq: int, op: Callable[[], Any], body: Any = None) -> str:
        """Queue ``op`` as operation ``seq``; a repeated ``seq`` with the same body returns the
        first request id, with another body it is a 409."""
        key = digest(body)
        with self.lock:
            self.last_request = time.time()
            if seq in self.seen:
                rid, first = self.seen[seq]
                if first != key:
                    self.state.stats["conflicting_submits"] += 1
                    raise TinkerError(
                        409, f"seq_id {seq} of {self.model_id} was already used for a different request ({rid})"
                    )
                self.state.stats["duplicate_submits"] += 1
                return rid
            if self._closed is not None:
                raise TinkerError(410, f"training run {self.model_id} has ended ({self._closed})")
            if seq < self.next_seq:
                raise TinkerError(
                    409, f"seq_id {seq} of {self.model_id} is behind the next expected seq_id {self.next_seq}"
                )
            future = self.state.new_future(owner=self.owner)
            self.seen[seq] = (future.request_id, key)
            self.waiting[seq] = (future, op)
            while self.next_seq in self.waiting:
                fut, fn = self.waiting.pop(self.next_seq)
                self._queue.append((self.next_seq, fut, fn))
                self.next_seq += 1
            self._wake.notify()
            return future.request_id

    def checked(self, seq: int, body: Any, check: Callable[[], Any]) -> Any:
        """``check()``'s value; if it refuses the request (400), operation ``seq`` is still taken,
        as a failed one, so the operations behind it do not wait for a seq_id that never comes."""
        try:
            return check()
        except TinkerError as err:
            refusal = err

        def refused() -> Any:
            raise refusal

        try:
            self.submit(seq, refused, body)
        except TinkerError:
            pass
        raise refusal

    def _work(self) -> None:
        try:
            while True:
                with self.lock:
                    while not self._queue and self._closed is None:
                        self._wake.wait()
                    if not self._queue:
                        return
                    seq, future, fn = self._queue.popleft()
                try:
                    payload = fn()
                except RlkitError as exc:
                    future.finish(error=_one_line(exc), category="user")
                except TinkerError as exc:
                    future.finish(error=exc.message, category="user")
                except BaseException as exc:  # noqa: BLE001 - reported through the future: every future resolves
                    future.finish(error=f"{type(exc).__name__}: {_one_line(exc)}", category="server")
                else:
                    future.finish(payload)
                with self.lock:
                    self.executed.append(seq)
                self.state.stats["training_ops_executed"] += 1
        finally:
            self.trainer.stop()

    def keep_sampler(self, sampler_id: str) -> None:
        """Keep the newest in-memory samplers; older ones release their weights."""
        self.ephemeral.append(sampler_id)
        while len(self.ephemeral) > KEPT_EPHEMERAL_SAMPLERS:
            self.state.release_sampler(self.ephemeral.popleft(), "a newer in-memory sampler of its run replaced it")

    def close(self, reason: str = "the server stopped", wait: bool = True) -> int:
        """End the run: every operation not yet started fails ("cancelled", naming ``reason``),
        the running one finishes, then the engine's client is released (``wait``: block until
        then). Returns how many operations were cancelled."""
        with self.lock:
            if self._closed is None:
                self._closed = reason
            cancelled = [fut for _, fut, _ in self._queue] + [fut for fut, _ in self.waiting.values()]
            self._queue.clear()
            self.waiting.clear()
            self._wake.notify()
        for fut in cancelled:
            fut.finish(error=f"training run {self.model_id}: cancelled before it ran, the run ended ({reason})")
        self.state.stats["training_ops_cancelled"] += len(cancelled)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)
        return len(cancelled)

    @property
    def ended(self) -> bool:
        return self._closed is not None and not self._thread.is_alive()

    def wire(self) -> Dict[str, Any]:
        ckpts = self.state.checkpoints_of(self.model_id)
        last = lambda kind: next((c.wire() for c in reversed(ckpts) if c.kind == kind), None)  # noqa: E731
        return {
            "training_run_id": self.model_id,
            "base_model": self.base_model,
            "model_owner": "local",
            "is_lora": True,
            "corrupted": False,
            "lora_rank": self.rank,
            "last_request_time": _iso(self.last_request),
            "last_checkpoint": last("training"),
            "last_sampler_checkpoint": last("sampler"),
            "user_metadata": self.user_metadata,
        }

