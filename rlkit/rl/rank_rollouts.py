"""Rollouts data-parallel over N ranks: each rank rolls out a share of the groups, every rank gets all.

On N ranks (``torchrun``: the local engine sharded with FSDP2, :mod:`rlkit.backends.local.distributed`)
every rank runs the same loop, so without this every rank would sample every group: N copies of
one decode. :func:`collect_over_ranks` (called by :func:`rlkit.rl.collect.collect_groups`) gives rank
``r`` the groups ``i`` with ``i % N == r`` — a group whole: its G samples share one prefill and its
rewards are scored once, on one rank — rolls them out with the rank's own sampler (its own GPU
with CUDA; the local sampler or a vLLM server), and exchanges the results: each rank publishes its
groups, pickled, in the key-value store of the process group (the TCPStore that ``torchrun``
starts), reads the other ranks' and the last reader deletes them. Every rank returns the same groups
in input order, so the ranks' training batches are identical by construction, not only up to
float noise.

**Why the store and not a collective.** Rollouts run on rollout threads: the asynchronous schedule
samples the next batch while the training thread runs ``forward_backward`` (whose all-gathers are
collectives on the default group), and evaluation rolls out its greedy and sampled sets on two
threads at once. Collectives must be entered in one order on every rank; the store's keys need no
order (and the store is polled, never waited on: :func:`_get`). A call's key is a digest of what the call is — the sampler version, the seeds, the sampling
parameters, the group size and each group's problem — plus how many calls with that same digest
this process made before it, so the ranks' keys agree however their threads interleave.

**Failures.** A group whose rollout raises on its rank is published as that exception (or, if it
cannot be pickled, a :class:`~rlkit.errors.OperationError` naming it); every rank raises it. A rank
that dies or hangs leaves the others waiting at most the store's timeout (``backend.rank_timeout_s``),
and ``torchrun`` ends every rank when one dies.

One process (``WORLD_SIZE`` 1 or no process group) never comes here: :func:`ranks_sharing` is 1.
A user's loop that calls ``sample`` itself keeps sampling every request on every rank (correct,
N times the decode); the built-in RL, distillation and evaluation rollouts go through
:func:`~rlkit.rl.collect.collect_groups`.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, List, Sequence, Tuple

from rlkit.errors import OperationError

#: the store's key prefix of every exchange
PREFIX = "rlkit/rollouts"


def ranks_sharing() -> int:
    """How many ranks share rollouts: the process group's size, 1 outside ``torchrun``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


def call_digest(parts: Sequence[Any]) -> str:
    """A digest of a call's description (``repr`` of each part, object addresses left out): the same
    on every rank for the same call."""
    h = hashlib.sha256()
    for part in parts:
        h.update(_ADDRESS.sub("", repr(part)).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Ordinals:
    """How many calls with each digest this process has made: the second identical call gets another key."""

    def __init__(self) -> None:
        self._seen: Counter = Counter()
        self._lock = threading.Lock()

    def next(self, digest: str) -> int:
        with self._lock:
            n = self._seen[digest]
            self._seen[digest] += 1
            return n


_ORDINALS = _Ordinals()


def _store() -> Any:
    import torch.distributed.distributed_c10d as c10d

    return c10d._get_default_store()  # the process group's own store (torchrun's TCPStore)


def _portable(value: Any) -> Any:
    """``value``, or for an exception that does not survive pickling, an OperationError naming it."""
    if not isinstance(value, BaseException):
        return value
    try:
        pickle.loads(pickle.dumps(value))
        return value
    except Exception:  # noqa: BLE001 - e.g. an exception class whose __init__ takes other arguments
        return OperationError(f"{type(value).__name__}: {value}")


def _get(store: Any, key: str) -> bytes:
    """``store.get(key)`` once the key is there, polled: the process's store client is one
    connection, and a blocking ``get`` on one rollout thread would hold it while another thread's
    ``set`` — the one another rank waits for — queues behind it (a deadlock across ranks). Bounded
    by the store's timeout (``backend.rank_timeout_s``)."""
    deadline = time.monotonic() + store.timeout.total_seconds()
    pause = 0.001
    while not store.check([key]):
        if time.monotonic() > deadline:
            raise OperationError(f"rollouts on N ranks: another rank did not publish its groups within "
                                 f"{store.timeout.total_seconds():.0f} s ({key}); it stopped or hangs")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return store.get(key)


def _encode(value: Dict[int, Any]) -> bytes:
    try:
        return pickle.dumps({i: _portable(v) for i, v in value.items()}, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - e.g. an env put an unpicklable object in a transition's info
        raise OperationError(f"rollouts on N ranks: a rollout group cannot be sent to the other ranks ({exc}); "
                             "keep Transition.info to plain data") from exc


def collect_over_ranks(
    items: Sequence[Any],
    run: Callable[[Sequence[int]], Dict[int, Any]],
    release: Callable[[int], None],
    describe: Sequence[Any],
) -> List[Any]:
    """Every item's result on every rank, each computed on one rank (module docstring).

    ``run(indices)`` computes this rank's share and returns ``{index: result}``; a result that is
    an exception is raised on every rank. ``release(i)`` is called for each item another rank runs.
    ``describe`` is the call's description (the same on every rank for the same call)."""
    import torch.distributed as dist

    rank, ranks = dist.get_rank(), dist.get_world_size()
    digest = call_digest(describe)
    key = f"{PREFIX}/{digest}/{_ORDINALS.next(digest)}"
    mine = [i for i in range(len(items)) if i % ranks == rank]
    for i in range(len(items)):
        if i % ranks != rank:
            release(i)
    try:
        results = run(mine)
    except Exception as exc:  # noqa: BLE001 - published: every rank raises it, none waits for it
        results = {i: exc for i in mine}
    try:
        payload = _encode({i: results[i] for i in mine})
    except OperationError as exc:  # an unpicklable result: the others must not wait for it
        payload = pickle.dumps({i: exc for i in mine})
    store = _store()
    store.set(f"{key}/{rank}", payload)
    got: Dict[int, Any] = {}
    for other in range(ranks):
        got.update(pickle.loads(payload if other == rank else _get(store, f"{key}/{other}")))
    if store.add(f"{key}/read", 1) == ranks:  # the last reader cleans up
        for other in range(ranks):
            store.delete_key(f"{key}/{other}")
        store.delete_key(f"{key}/read")
    for i in range(len(items)):
        if isinstance(got.get(i), BaseException):
            raise got[i]
    return [got[i] for i in range(len(items))]


def sample_all(sampler: Any, requests: Sequence[Tuple[Any, int, Any]]) -> List[Any]:
    """Every ``(model_input, num_samples, sampling_params)`` request's response, in order; submitted
    together (one decode batch). On N ranks each rank samples a share and every rank gets all
    (:func:`collect_over_ranks`), as the rollouts of :func:`rlkit.rl.collect.collect_groups`."""
    def run(indices: Sequence[int]) -> Dict[int, Any]:
        futures = {i: sampler.sample(requests[i][0], num_samples=requests[i][1], sampling_params=requests[i][2]) for i in indices}
        return {i: f.result() for i, f in futures.items()}

    if ranks_sharing() <= 1:
        got = run(range(len(requests)))
        return [got[i] for i in range(len(requests))]
    return collect_over_ranks(requests, run, lambda i: None, ("sample_all", [(m.to_ints(), n, p) for m, n, p in requests]))
