"""The server's state: sessions, training runs, samplers, futures and ``tinker://`` checkpoints.

Everything runs on one :class:`~rlkit.backends.local.clients.LocalServiceClient` (on N ranks,
``rlkit serve tinker --nproc N``: rank 0's :class:`~rlkit.backends.local.follow.LeadService`,
whose engine operations every rank executes in one order). A Tinker
*training run* (``model_id = "{session_id}:train:{n}"``) is a local LoRA training client; a
*sampling session* is a local sampling client on the base model, a saved checkpoint, or the
in-memory weights of ``save_weights_and_get_sampling_client``.

Semantics honoured (see ``docs/tinker.md``):

- **ordering**: a training run executes its operations strictly in ``seq_id`` order, one at a
  time, on its own worker thread; an operation whose predecessor has not arrived waits (the SDK
  submits the chunks of one ``forward_backward`` concurrently, the first one last);
- **deduplication**: a training operation is identified by ``(model_id, seq_id)``, a sample by
  ``(sampling_session_id, seq_id)``, a creation by ``(session_id, seq)``; a resubmission (the SDK
  retries with a new ``X-Idempotency-Key``) gets the first submission's future and is not run again;
- **futures**: every operation answers ``{"request_id": ...}`` at once; ``retrieve_future``
  long-polls until the result is ready (or answers ``try_again``, which the SDK re-polls at once).
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import itertools
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from rlkit.backends.stand_ins import EngineOptions, FaultOptions, StandInState
from rlkit.backends.tinker.server import checks
from rlkit.backends.tinker.server.inflight import InFlight
from rlkit.backends.tinker.server.records import (  # noqa: F401 - the server's modules import them from here too
    Future,
    TinkerError,
    _iso,
    _one_line,
    bad_request,
    digest,
    not_found,
)
from rlkit.errors import InvalidInputError

if TYPE_CHECKING:
    from rlkit.backends.tinker.server.runs import Run

KEPT_FUTURES = 4096  # finished futures kept pollable (older results are forgotten)

#: Who is calling: the owner of what this request creates, and whose things it may see. Set by
#: the HTTP layer per request (the hash of the API key when the server has keys; ``None`` when it
#: has none, so every caller is the same principal). ``None`` inside the server's own threads.
CALLER: "contextvars.ContextVar[Optional[str]]" = contextvars.ContextVar("rlkit_tinker_caller", default=None)
_CURRENT = object()  # a lookup's default owner: the current caller


def principal(api_key: str) -> str:
    """The owner id of an API key (its hash: keys are never stored)."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:24]


@dataclass
class ServerOptions(EngineOptions, FaultOptions):
    """How the server behaves. The local engine's options (``state_dir``: checkpoints and their
    index, ``precision``, ``max_batch_rows``, ``models``: extra base-model name -> local model, ...)
    and the fault-injection options (rates are probabilities per API request; throttled: 429,
    errors: 500) are :class:`~rlkit.backends.stand_ins.EngineOptions` and
    :class:`~rlkit.backends.stand_ins.FaultOptions`, both stand-ins'."""

    lora_alpha: int = 32  # Tinker has no alpha: the service's scale is fixed, alpha / rank
    api_key: Optional[str] = None  # required in X-API-Key when set (always beyond loopback)
    api_keys: Tuple[str, ...] = ()  # more accepted keys; each key owns its sessions, runs, futures, checkpoints
    long_poll_s: float = 30.0  # retrieve_future waits this long before answering try_again (the SDK times out at 45 s)
    session_timeout_s: float = (
        120.0  # a session without a heartbeat for this long is finished (the SDK beats every 10 s)
    )
    fwdbwd_max_chunk_len: int = 1024  # datums per forward_backward request (the SDK splits bigger batches)
    # bounds on one request's work and memory (client errors, 400, beyond them)
    max_body_bytes: int = 256 << 20  # a request body, before and after decompression (413 beyond)
    max_num_samples: int = 64  # asample's num_samples (at most half of max_batch_rows: others can join a decode)
    request_deadline_s: float = 900.0  # a sample still running this long after its submit is cancelled (0: never)
    default_max_tokens: int = 1024  # a sample with no max_tokens (never more than the context window)
    max_metadata_bytes: int = 64 << 10  # user_metadata of a session, run or checkpoint (as JSON)
    finished_session_ttl_s: float = 600.0  # a finished session is forgotten this long after it ended


@dataclass
class Checkpoint:
    tinker_path: str
    local_id: str
    kind: str  # "training" (save_state) | "sampler" (save_weights_for_sampler)
    model_id: str
    name: str
    base_model: str
    created: float
    user_metadata: Optional[Dict[str, str]] = None
    owner: Optional[str] = None  # the principal() of the key that saved it (None: everyone's)

    def wire(self) -> Dict[str, Any]:
        segment = "weights" if self.kind == "training" else "sampler_weights"
        size = sum(f.stat().st_size for f in Path(self.local_id.removeprefix("local://")).glob("*") if f.is_file())
        return {
            "checkpoint_id": f"{segment}/{self.name}",
            "checkpoint_type": self.kind,
            "time": _iso(self.created),
            "tinker_path": self.tinker_path,
            "size_bytes": size,
            "public": False,
            "user_metadata": self.user_metadata,
        }


@dataclass
class Session:
    id: str
    user_metadata: Dict[str, Any]
    display_name: Optional[str]
    created: float = field(default_factory=time.time)
    finished: Optional[str] = None
    finished_at: Optional[float] = None
    runs: List[str] = field(default_factory=list)
    samplers: List[str] = field(default_factory=list)
    last_heartbeat: float = field(default_factory=time.time)
    owner: Optional[str] = None


@dataclass
class Sampler:
    id: str
    base_model: str
    model_path: Optional[str]
    client: Any  # LocalSamplingClient, or None once released
    owner: Optional[str] = None
    seen: Dict[int, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ServerState(StandInState):
    """Sessions, runs, samplers, futures and checkpoints of one server."""

    options: ServerOptions

    def __init__(self, options: ServerOptions):
        from rlkit.backends.local.follow import local_service

        super().__init__(options, "tinker", local_service)  # on rank 0 of N ranks, the leader of the ranks' operation stream
        self.sessions: Dict[str, Session] = {}
        self.runs: Dict[str, Run] = {}
        self.samplers: Dict[str, Sampler] = {}
        self.creations: Dict[Tuple[str, str, int], Tuple[str, str]] = {}  # (session, kind, seq) -> (request_id, digest)
        self.futures: "collections.OrderedDict[str, Future]" = collections.OrderedDict()
        self.checkpoints: Dict[str, Checkpoint] = {}
        self._ids = itertools.count(1)
        self.inflight = InFlight()
        self._load_index()
        self.start_reaper()

    def _reap(self) -> None:
        """Finish sessions whose client went away without finishing them (no heartbeat for
        ``session_timeout_s``), so their training runs release the engine's memory."""
        while not self._closed.wait(min(5.0, self.options.session_timeout_s)):
            now = time.time()
            with self.lock:
                stale = [
                    s.id
                    for s in self.sessions.values()
                    if s.finished is None and now - s.last_heartbeat > self.options.session_timeout_s
                ]
            for sid in stale:
                self.stats["sessions_expired"] += 1
                self.finish_session(sid, "expired")
            self.purge(now)

    # -- who may see what -------------------------------------------------------------------------
    @staticmethod
    def caller() -> Optional[str]:
        return CALLER.get()

    @staticmethod
    def visible(owner: Optional[str], caller: Any = _CURRENT) -> bool:
        """Whether ``caller`` (default: the current request's) may see a thing owned by ``owner``."""
        caller = CALLER.get() if caller is _CURRENT else caller
        return caller is None or owner is None or owner == caller

    # -- futures ----------------------------------------------------------------------------------
    def new_future(self, owner: Any = _CURRENT) -> Future:
        # request ids are unguessable (128 random bits): on a server with one key they are what
        # keeps one client from polling another's futures
        future = Future(
            request_id=f"req-{next(self._ids):08d}-{uuid.uuid4().hex}",
            owner=CALLER.get() if owner is _CURRENT else owner,
        )
        with self.lock:
            self.futures[future.request_id] = future
            if len(self.futures) > KEPT_FUTURES:
                for rid in [r for r, f in self.futures.items() if f.done.is_set()][: len(self.futures) - KEPT_FUTURES]:
                    del self.futures[rid]
        return future

    def _lookup(self, table: Dict[str, Any], key: str, what: str) -> Any:
        """``table[key]`` where the caller may see it (its ``owner``); else a 404 ``no <what>``."""
        with self.lock:
            found = table.get(key)
        if found is None or not self.visible(found.owner):
            raise not_found(f"no {what}")
        return found

    def future(self, request_id: str) -> Future:
        return self._lookup(self.futures, request_id, f"future {request_id!r} (unknown, or its result was forgotten)")

    def once(self, session_id: str, kind: str, seq: int, start: Callable[[Future], None], body: Any = None) -> str:
        """A creation request (``create_model``, create-via-load, a sampling session) run once per
        ``(session, kind, seq)``; a resubmission with the same body returns the first request id,
        one with another body is a 409."""
        content = digest(body)
        with self.lock:
            key = (session_id, kind, seq)
            if key in self.creations:
                rid, first = self.creations[key]
                if first != content:
                    self.stats["conflicting_submits"] += 1
                    raise TinkerError(409, f"model_seq_id {seq} of session {session_id} was already used for a different request ({rid})")
                self.stats["duplicate_submits"] += 1
                return rid
            future = self.new_future(owner=self.session(session_id).owner)
            self.creations[key] = (future.request_id, content)
        start(future)
        return future.request_id

    # -- lookups ----------------------------------------------------------------------------------
    def session(self, session_id: str) -> Session:
        return self._lookup(self.sessions, session_id, f"session {session_id!r}")

    def live_session(self, session_id: str) -> Session:
        """A session that may still create runs and samplers (410 once finished or expired)."""
        s = self.session(session_id)
        if s.finished is not None:
            raise TinkerError(410, f"session {s.id} has finished ({s.finished}); create a new session")
        return s

    def session_is_live(self, session_id: str) -> bool:
        with self.lock:
            s = self.sessions.get(session_id)
        return s is not None and s.finished is None

    def run(self, model_id: str) -> Run:
        return self._lookup(self.runs, model_id, f"training run {model_id!r}")

    def sampler(self, sampler_id: str) -> Sampler:
        return self._lookup(self.samplers, sampler_id, f"sampling session {sampler_id!r}")

    def checkpoint(self, tinker_path: str, owner: Any = _CURRENT) -> Checkpoint:
        """The checkpoint at ``tinker_path``, if ``owner`` (default: the caller) may see it."""
        with self.lock:
            c = self.checkpoints.get(tinker_path.rstrip("/"))
        if c is None or not self.visible(c.owner, owner):
            if not tinker_path.startswith("tinker://"):
                raise bad_request(f"{tinker_path!r} is not a tinker:// path")
            raise not_found(f"no checkpoint {tinker_path!r}")
        return c

    def checkpoints_of(self, model_id: str) -> List[Checkpoint]:
        with self.lock:
            mine = (c for c in self.checkpoints.values() if c.model_id == model_id and self.visible(c.owner))
            return sorted(mine, key=lambda c: c.created)

    # -- sessions ---------------------------------------------------------------------------------
    def create_session(self, body: Dict[str, Any]) -> Session:
        limit = self.options.max_metadata_bytes
        s = Session(
            id=str(uuid.uuid4()),
            user_metadata=checks.metadata(body.get("user_metadata"), "create_session", limit) or {},
            display_name=checks.text(body.get("display_name"), "create_session.display_name", 256, optional=True),
            owner=CALLER.get(),
        )
        with self.lock:
            self.sessions[s.id] = s
        self.stats["sessions_created"] += 1
        return s

    def finish_session(self, session_id: str, reason: str) -> None:
        """End a session: its queued training operations and running samples are cancelled
        (their futures fail in one line), the operations already running finish, and its runs
        and samplers release the engine's memory."""
        s = self.session(session_id)
        with self.lock:
            if s.finished is None:
                s.finished = reason
                s.finished_at = time.time()
            runs = [self.runs[m] for m in s.runs if m in self.runs]
            samplers = list(s.samplers)
        why = f"its session {s.id} finished ({s.finished})"
        for run in runs:
            run.close(why, wait=False)  # never holds the request: the running operation ends on its own
        for sid in samplers:
            self.release_sampler(sid, why)

    def add_run(self, run: Run) -> None:
        with self.lock:
            session = self.session(run.session_id)
            self.runs[run.model_id] = run
            session.runs.append(run.model_id)
            late = session.finished is not None  # the session finished while the run was being created
        if late:
            run.close(f"its session {session.id} finished ({session.finished}) while it was created", wait=False)

    def purge(self, now: Optional[float] = None) -> int:
        """Forget sessions finished more than ``finished_session_ttl_s`` ago: their runs (already
        closed), samplers, creation records and metadata. Checkpoints stay listed."""
        now = time.time() if now is None else now
        ttl = self.options.finished_session_ttl_s
        with self.lock:
            old = [s for s in self.sessions.values() if s.finished_at is not None and now - s.finished_at >= ttl]
            for s in old:
                del self.sessions[s.id]
                for m in s.runs:
                    self.runs.pop(m, None)
                for sid in s.samplers:
                    self.samplers.pop(sid, None)
                for key in [k for k in self.creations if k[0] == s.id]:
                    del self.creations[key]
        self.stats["sessions_purged"] += len(old)
        return len(old)

    def add_sampler(self, session_id: str, sampler: Sampler) -> None:
        with self.lock:
            session = self.session(session_id)
            self.samplers[sampler.id] = sampler
            session.samplers.append(sampler.id)
            late = session.finished is not None
        if late:
            self.release_sampler(sampler.id, f"its session {session.id} finished ({session.finished})")

    def release_sampler(self, sampler_id: str, reason: str) -> None:
        """Stop a sampler: its running samples are cancelled (their futures fail naming
        ``reason``) and its weights released."""
        with self.lock:
            s = self.samplers.get(sampler_id)
        if s is None:
            return
        with s.lock:  # after this, no sample of it can start (asample submits under this lock)
            client, s.client = s.client, None
        cancelled = self.inflight.cancel_sampler(sampler_id, f"sample: cancelled, sampling session {sampler_id} was released ({reason})")
        self.stats["samples_cancelled"] += cancelled
        if client is not None:
            client.stop()

    # -- checkpoints ------------------------------------------------------------------------------
    def add_checkpoint(self, ckpt: Checkpoint) -> None:
        with self.lock:
            self.checkpoints[ckpt.tinker_path] = ckpt
            self._save_index()

    def delete_checkpoint(self, tinker_path: str) -> None:
        import shutil

        ckpt = self.checkpoint(tinker_path)
        with self.lock:
            self.checkpoints.pop(ckpt.tinker_path, None)
            self._save_index()
        shutil.rmtree(ckpt.local_id.removeprefix("local://"), ignore_errors=True)

    def _index_path(self) -> Path:
        return self.root / "tinker_checkpoints.json"

    def _save_index(self) -> None:
        rows = [vars(c) for c in self.checkpoints.values()]
        tmp = self._index_path().with_suffix(".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        os.replace(tmp, self._index_path())

    def _load_index(self) -> None:
        path = self._index_path()
        if not path.is_file():
            return
        try:
            rows = json.loads(path.read_text())
            for row in rows:
                c = Checkpoint(**row)
                if Path(c.local_id.removeprefix("local://")).is_dir():
                    self.checkpoints[c.tinker_path] = c
        except (ValueError, TypeError) as exc:
            raise InvalidInputError(f"{path}: not a checkpoint index ({exc})") from None

    def summary(self) -> Dict[str, Any]:
        """Counters and per-run facts, for tests (``GET /_rlkit/stats``)."""
        with self.lock:
            runs = {m: {"executed_seqs": list(r.executed), "next_seq": r.next_seq} for m, r in self.runs.items()}
            return {
                "stats": dict(self.stats),
                "runs": runs,
                "checkpoints": len(self.checkpoints),
                "samplers": len(self.samplers),
                "samples_running": self.inflight.count(),
            }

    def end_work(self) -> None:
        self.inflight.close("sample: cancelled, the server stopped")
        with self.lock:
            runs = list(self.runs.values())
        for run in runs:
            run.close("the server stopped")
