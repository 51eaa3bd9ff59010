"""The emulator's state: sessions, their operations, model packages, billing — on the local engine.

Every training session is a :class:`~rlkit.backends.local.clients.LocalTrainingClient` on the
session's base model (a LoRA adapter and an AdamW optimizer). Every ``saveState`` /
``saveWeights`` writes a local checkpoint and registers it as a *model package version* in the
session's model package group; its ARN is the checkpoint id the client sees.

Service semantics honoured here (see ``docs/sagemaker.md`` for the full list):

- **statuses** move ``Created -> Running -> Stopping -> Stopped`` (``Blocked`` while a sequence
  gap holds the queue; ``Expired`` after the inactivity timeout or an injected expiry; ``Deleting``
  then gone after ``DeleteTrainingSession``);
- **ordering**: training operations run in ``sequenceNumber`` order; an operation whose
  predecessor has not arrived waits (``Pending``) and the session reports ``Blocked`` until the gap
  is filled;
- **idempotency**: a repeated ``clientToken`` returns the first submission's ``operationId`` and is
  not executed again; a sequence number already taken by another token is a ``ConflictException``;
- **billing**: prefill, sampled and training tokens are counted per session
  (``DescribeTrainingSession`` -> ``BillableTokenUsage``).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from rlkit.backends.sagemaker import names
from rlkit.backends.sagemaker.emulator.options import STRICT_MAX_REQUEST_BYTES, EmulatorOptions  # noqa: F401 - re-exported
from rlkit.backends.sagemaker.emulator.shapes import ServiceError, validation
from rlkit.backends.stand_ins import StandInState

ACTIVE = ("Created", "Scheduled", "Running", "Blocked")
RUNTIME_OK = ("Running", "Blocked")
DELETABLE = ("Stopped", "Failed", "DeletionFailed", "Expired")
KEPT_OPERATIONS = 2048  # per session and kind: results older than this are forgotten
@dataclass
class Operation:
    id: str
    kind: str
    config: Dict[str, Any]
    seq: Optional[int] = None
    token: Optional[str] = None
    status: str = "Pending"
    result: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    usage: Optional[Dict[str, Any]] = None
    parsed: Any = None
    polls: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, status: str, result: Optional[Dict[str, Any]] = None, error: Optional[str] = None) -> None:
        if self.done.is_set():
            return
        self.status, self.result, self.error = status, result, error
        self.done.set()

    def wire(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"status": self.status}
        if self.result is not None:
            out["operationResult"] = {self.kind: self.result}
        if self.error is not None:
            out["errorDetails"] = self.error
        if self.usage is not None:
            out["tokenUsage"] = self.usage
        return out


@dataclass
class Package:
    arn: str
    group: str
    version: int
    kind: str  # "checkpoint" (saveState) | "model" (saveWeights)
    local_id: str
    description: str
    created: float
    hub_name: str
    hub_version: str
    local_model: str
    session: str
    s3_uri: str


@dataclass
class Session:
    name: str
    arn: str
    request: Dict[str, Any]
    local_model: str
    hub: Dict[str, str]
    created: float
    status: str = "Created"
    modified: float = 0.0
    end_time: Optional[float] = None
    error_details: Optional[str] = None
    trainer: Any = None
    next_seq: int = 1
    last_received_seq: int = 0
    dispatched: int = 0
    waiting: Dict[int, Operation] = field(default_factory=dict)
    by_token: Dict[str, tuple] = field(default_factory=dict)  # clientToken -> (operationId, sequenceNumber)
    by_seq: Dict[int, str] = field(default_factory=dict)  # sequenceNumber -> clientToken ("" if none)
    ops: Dict[str, Operation] = field(default_factory=dict)
    sampling_ops: Dict[str, Operation] = field(default_factory=dict)
    sampling_weights: str = ""  # local checkpoint id the sampler uses when a request names none
    billing: Dict[str, int] = field(default_factory=lambda: {"prefill": 0, "sample": 0, "training": 0})
    executed_seqs: List[int] = field(default_factory=list)
    last_activity: float = field(default_factory=time.monotonic)
    blocked_since: Optional[float] = None  # monotonic time the session became Blocked
    warmup_left: int = 0  # strict: transient 5xx still to answer to runtime submits after Running
    sampling_warmup_left: int = 0  # strict: transient 5xx still to answer to sampling submits after a saveWeights
    num_parameters: int = 0  # of the base model (for the throughput metrics)
    inflight: Dict[str, Any] = field(default_factory=dict)  # id -> (Operation or None for a chat, local future): sampling now
    lock: threading.RLock = field(default_factory=threading.RLock)

    def set_status(self, status: str) -> None:
        self.status = status
        self.modified = time.time()
        if status in ("Stopped", "Failed", "Expired"):
            self.end_time = self.end_time or time.time()

    def remember(self, table: Dict[str, Operation], op: Operation) -> None:
        """Keep ``op`` pollable; forget the oldest finished operations beyond :data:`KEPT_OPERATIONS`
        (their results, that is: a late poll gets ResourceNotFoundException, while a repeated
        clientToken is still recognised)."""
        table[op.id] = op
        if len(table) > KEPT_OPERATIONS:
            for old_id in [k for k, o in table.items() if o.done.is_set()][: len(table) - KEPT_OPERATIONS]:
                del table[old_id]

    def require_runtime(self, strict: bool = True) -> None:
        """Refuse runtime requests unless Running or Blocked: a 409 ``ConflictException`` as the
        runtime model documents (strict), or the 400 the permissive emulator answered."""
        if self.status not in RUNTIME_OK:
            message = f"Training session {self.name} is in status {self.status}; it must be Running or Blocked to accept requests"
            raise ServiceError("ConflictException", message) if strict else validation(message)

    def update_blocked(self) -> None:
        """Running <-> Blocked as the sequence gap opens and closes (lock held)."""
        if self.status not in RUNTIME_OK:
            return
        if self.waiting:
            if self.status != "Blocked":
                self.blocked_since = time.monotonic()
            self.set_status("Blocked")
        else:
            self.blocked_since = None
            self.set_status("Running")


class EmulatorState(StandInState):
    """All sessions, model package groups and packages of one emulated account and region."""

    options: EmulatorOptions

    def __init__(self, options: EmulatorOptions):
        from rlkit.backends.local.clients import LocalServiceClient

        super().__init__(options, "emulator", LocalServiceClient)
        self.sessions: Dict[str, Session] = {}
        self.groups: Dict[str, Dict[str, Any]] = {}
        self.packages: Dict[str, Package] = {}
        self._op_ids = itertools.count(1)
        self.start_reaper()

    # -- lookups ----------------------------------------------------------------------------------
    def session(self, name: str, *, runtime: bool = False) -> Session:
        with self.lock:
            s = self.sessions.get(name)
        if s is None:
            code = "ResourceNotFoundException" if runtime else "ResourceNotFound"
            raise ServiceError(code, f"Training session {name} does not exist")
        s.last_activity = time.monotonic()
        return s

    def package(self, arn: str, *, runtime: bool = True) -> Package:
        with self.lock:
            p = self.packages.get(arn)
        if p is None:
            if names.parse_model_package_arn(arn) is None:
                raise validation(f"Value '{arn}' is not a valid model package ARN")
            code = "ResourceNotFoundException" if runtime else "ValidationException"
            raise ServiceError(code, f"Model package {arn} does not exist.")
        return p

    def new_op_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._op_ids):08d}-{uuid.uuid4().hex[:12]}"

    # -- model package groups and packages ----------------------------------------------------------
    def ensure_group(self, name_or_arn: str, *, create: bool, description: str = "") -> Dict[str, Any]:
        name = names.group_name(name_or_arn)
        with self.lock:
            group = self.groups.get(name)
            if group is None:
                if not create:
                    raise validation(f"ModelPackageGroup {name} does not exist.")
                group = {
                    "name": name,
                    "arn": names.model_package_group_arn(self.options.region, self.options.account, name),
                    "description": description,
                    "created": time.time(),
                    "next_version": 1,
                }
                self.groups[name] = group
            return group

    def register_package(self, session: Session, kind: str, local_id: str, description: str) -> Package:
        group_arn = session.request.get("ModelPackageGroupArn") or ""
        group = self.ensure_group(group_arn, create=True)
        with self.lock:
            version = group["next_version"]
            group["next_version"] += 1
            arn = names.model_package_arn(self.options.region, self.options.account, group["name"], version)
            out = session.request["OutputConfig"]["S3Location"]["Path"].rstrip("/")
            package = Package(
                arn=arn, group=group["name"], version=version, kind=kind, local_id=local_id,
                description=description or f"{'checkpoint' if kind == 'checkpoint' else 'weights'} saved by training session {session.name}",
                created=time.time(), hub_name=session.hub["name"], hub_version=session.hub["version"] or "1.0.0",
                local_model=session.local_model, session=session.name,
                s3_uri=f"{out}/{session.name}/checkpoints/{group['name']}-{version}/",
            )
            self.packages[arn] = package
            self.stats["model_packages_registered"] += 1
        return package

    # -- sessions -----------------------------------------------------------------------------------
    def create_session(self, request: Dict[str, Any]) -> Session:
        opts = self.options
        name = request["TrainingSessionName"]
        base_arn = request["ModelConfig"]["BaseModelArn"]
        hub = names.parse_hub_content_arn(base_arn) or {}
        local_model = names.local_model_for_arn(base_arn, opts.models)
        if local_model is None:
            raise ServiceError("ResourceNotFound", f"Hub content {base_arn} does not exist or is not available for training sessions in {opts.region}.")
        if request.get("ModelPackageGroupArn"):
            self.ensure_group(request["ModelPackageGroupArn"], create=opts.auto_create_groups)
        with self.lock:
            # the quota is checked before the name (the order is not documented; this one hides a
            # retried create behind ResourceLimitExceeded when its own session filled the quota)
            active = sum(1 for s in self.sessions.values() if s.status in ACTIVE + ("Stopping",))
            if active >= opts.max_sessions:
                raise ServiceError(
                    "ResourceLimitExceeded",
                    f"The account-level service limit 'Number of active training sessions' is {opts.max_sessions} sessions; "
                    f"{active} are active. Stop sessions you no longer use.",
                )
            existing = self.sessions.get(name)
            if existing is not None:
                raise ServiceError("ResourceInUse", f"Training session {name} already exists (status {existing.status}).")
            now = time.time()
            session = Session(
                name=name, arn=names.session_arn(opts.region, opts.account, name), request=request,
                local_model=local_model, hub=hub, created=now, modified=now,
            )
            self.sessions[name] = session
            self.stats["sessions_created"] += 1
        ready = threading.Event()
        threading.Thread(target=self._provision, args=(session, ready), name=f"provision-{name}", daemon=True).start()
        ready.wait(opts.create_wait)
        return session

    def _provision(self, session: Session, ready: threading.Event) -> None:
        """``Created`` -> ``Scheduled`` (capacity found; the model loads) -> ``Running``."""
        try:
            if self.options.startup_delay_s:
                time.sleep(self.options.startup_delay_s / 2)
            with session.lock:
                if session.status == "Created":
                    session.set_status("Scheduled")
            if self.options.startup_delay_s:
                time.sleep(self.options.startup_delay_s / 2)
            lora = session.request["LoraConfig"]
            trainer = self.local.create_lora_training_client(
                session.local_model, rank=int(lora["Rank"]), alpha=int(lora["Alpha"]),
                training_session_name=session.name, seed=self.options.lora_seed,
            )
            with session.lock:
                if session.status in ("Created", "Scheduled"):
                    session.trainer = trainer
                    session.num_parameters = trainer.num_parameters
                    session.warmup_left = self.options.warmups
                    session.set_status("Running")
                    session.last_activity = time.monotonic()
                else:  # stopped while provisioning
                    trainer.stop()
        except Exception as exc:  # noqa: BLE001 - reported through DescribeTrainingSession
            with session.lock:
                session.error_details = f"{type(exc).__name__}: {exc}"[:1024]
                session.set_status("Failed")
        finally:
            ready.set()

    def _transition(self, name: str, allowed: Tuple[str, ...], to: str, refusal: str) -> Session:
        """Session ``name``, moved to status ``to`` when its status is one of ``allowed``; a
        ValidationException ``refusal`` (formatted with ``name`` and ``status``) otherwise."""
        session = self.session(name)
        with session.lock:
            if session.status not in allowed:
                raise validation(refusal.format(name=name, status=session.status))
            session.set_status(to)
        return session

    def stop_session(self, name: str) -> None:
        session = self._transition(name, ACTIVE, "Stopping",
                                   "Training session {name}: invalid session state transition from {status} to Stopping")
        threading.Thread(target=self._finish_stop, args=(session, "Stopped"), daemon=True).start()

    def expire(self, session: Session, reason: str) -> None:
        """End ``session`` as ``Expired`` (inactivity timeout, or an injected expiry)."""
        if self._expiring(session, reason):
            self._finish_stop(session, "Expired")

    def begin_expire(self, session: Session, reason: str) -> None:
        """:meth:`expire` from a thread that may hold the session's lock: the status changes
        now, the engine is released in the background."""
        if self._expiring(session, reason):
            threading.Thread(target=self._finish_stop, args=(session, "Expired"), daemon=True).start()

    def _expiring(self, session: Session, reason: str) -> bool:
        """An active ``session`` turned ``Stopping`` for ``reason`` (counted); False if not active."""
        with session.lock:
            if session.status not in ACTIVE:
                return False
            session.error_details = reason
            session.set_status("Stopping")
        self.stats["sessions_expired"] += 1
        return True

    def _finish_stop(self, session: Session, final: str) -> None:
        """End a session's work: operations waiting for a predecessor or queued on the engine are
        ``Skipped`` (the running one finishes), running samples are cancelled at their next decode
        step (``Skipped``; a chat request answers 409), then the engine is released."""
        trainer = session.trainer
        why = f"Training session {session.name} ended ({final}) before this operation ran"
        with session.lock:
            for op in session.waiting.values():
                op.finish("Skipped", error=why)
            session.waiting.clear()
            sampling = list(session.inflight.values())
            session.inflight.clear()
        if trainer is not None:
            cancelled = trainer.cancel_queued()  # their callbacks mark them Skipped (Runtime._complete)
            self.stats["training_ops_cancelled"] += cancelled
        for op, future in sampling:
            if op is not None:
                op.finish("Skipped", error=f"Training session {session.name} ended ({final}) before this sampling operation finished")
            future.cancel()
        self.stats["sampling_ops_cancelled"] += len(sampling)
        if trainer is not None:
            trainer.stop()
        with session.lock:
            session.trainer = None
            session.set_status(final)

    def track_sampling(self, session: Session, key: str, op: Optional[Operation], future: Any) -> None:
        """Remember a running sample so that the session's end cancels it (one that slipped in
        while the session was ending is cancelled at once)."""
        with session.lock:
            live = session.status in RUNTIME_OK
            if live:
                session.inflight[key] = (op, future)
        if not live:
            if op is not None:
                op.finish("Skipped", error=f"Training session {session.name} ended ({session.status}) before this sampling operation finished")
            future.cancel()
        future.add_done_callback(lambda _f: self.untrack_sampling(session, key))

    def untrack_sampling(self, session: Session, key: str) -> None:
        with session.lock:
            session.inflight.pop(key, None)

    def purge(self, now: Optional[float] = None) -> int:
        """Forget sessions that ended (Stopped, Failed, Expired) more than ``ended_session_ttl_s``
        ago: their operations, results, request and metadata (their engines were released when
        they ended); they leave every listing. Model packages stay (the registry is not the
        session's)."""
        now = time.time() if now is None else now
        ttl = self.options.ended_session_ttl_s
        with self.lock:
            old = [s for s in self.sessions.values()
                   if s.status in ("Stopped", "Failed", "Expired") and s.end_time is not None and now - s.end_time >= ttl]
            for s in old:
                del self.sessions[s.name]
        self.stats["sessions_purged"] += len(old)
        return len(old)

    def delete_session(self, name: str) -> None:
        self._transition(name, DELETABLE, "Deleting",
                         "Training session {name} is {status}; only Stopped, Failed or Expired sessions can be deleted")

        def remove() -> None:
            time.sleep(0.2)
            with self.lock:
                self.sessions.pop(name, None)

        threading.Thread(target=remove, daemon=True).start()

    def _reap(self) -> None:
        """Expire sessions idle for longer than ``session_ttl_s`` (the inactivity timeout); fail
        sessions Blocked on a sequence gap for longer than the gap timeout."""
        while not self._closed.wait(0.2):
            ttl, gap = self.options.session_ttl_s, self.options.gap_timeout
            now = time.monotonic()
            with self.lock:
                sessions = list(self.sessions.values())
            for s in sessions:
                if ttl and s.status in RUNTIME_OK and now - s.last_activity > ttl:
                    self.expire(s, f"Training session {s.name} expired after {ttl:g}s without activity")
                elif gap is not None and s.status == "Blocked" and s.blocked_since is not None and now - s.blocked_since > gap:
                    self.fail_blocked(s, gap)
            self.purge()

    def fail_blocked(self, session: Session, gap: float) -> None:
        """A gap that was never filled: the session fails and its queued operations are Skipped."""
        with session.lock:
            if session.status != "Blocked":
                return
            session.error_details = (f"Training session {session.name} waited {gap:g}s for the operation with sequence number "
                                     f"{session.next_seq}, which never arrived; the session failed")
            session.set_status("Stopping")
        self.stats["sessions_failed_on_gap"] += 1
        threading.Thread(target=self._finish_stop, args=(session, "Failed"), daemon=True).start()

    def describe(self, session: Session) -> Dict[str, Any]:
        r = session.request
        detail: Dict[str, Any] = {
            "TrainingSessionArn": session.arn,
            "TrainingSessionName": session.name,
            "TrainingSessionStatus": session.status,
            "CreationTime": session.created,
            "LastModifiedTime": session.modified,
            "LastReceivedSequenceNumber": session.last_received_seq,
            "BillableTokenUsage": {
                "PrefillTokenCount": session.billing["prefill"],
                "SampleTokenCount": session.billing["sample"],
                "TrainingTokenCount": session.billing["training"],
            },
            "RoleArn": r["RoleArn"],
            "LoraConfig": r["LoraConfig"],
            "ModelConfig": r["ModelConfig"],
            "OutputConfig": r["OutputConfig"],
        }
        for key in ("ModelPackageGroupArn", "VpcConfig", "Tags"):
            if r.get(key):
                detail[key] = r[key]
        if session.status == "Blocked" and session.waiting and not session.error_details:
            detail["ErrorDetails"] = f"Waiting for the operation with sequence number {session.next_seq}"
        if session.end_time:
            detail["EndTime"] = session.end_time
        if session.error_details:
            detail["ErrorDetails"] = session.error_details
        return detail

    def summary(self) -> Dict[str, Any]:
        """Counters and per-session facts, for tests and ``GET /_emulator/stats``."""
        with self.lock:
            sessions = {
                s.name: {
                    "status": s.status,
                    "last_received_seq": s.last_received_seq,
                    "executed_seqs": list(s.executed_seqs),
                    "training_ops": len(s.by_seq),
                    "sampling_ops": len(s.sampling_ops),
                    "billing": dict(s.billing),
                }
                for s in self.sessions.values()
            }
            return {"stats": dict(self.stats), "sessions": sessions, "packages": len(self.packages)}

    def end_work(self) -> None:
        with self.lock:
            sessions = list(self.sessions.values())
        for s in sessions:
            if s.status in ACTIVE:
                with s.lock:
                    s.set_status("Stopping")
                self._finish_stop(s, "Stopped")
