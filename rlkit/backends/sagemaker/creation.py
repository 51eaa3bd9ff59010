"""Creating a session so that none leaks, whatever happens to the create.

Every session rlkit creates gets a name rlkit chose (``<prefix>-<8 hex>``), written to the run's
ledger *before* ``CreateTrainingSession`` is sent. A fresh random name that exists on the service
can only be this create's own session, so when the create fails the adapter looks it up:

- **the create reached the service but its answer did not reach us** (a lost response that
  botocore retried into ``ResourceInUse``, or into ``ResourceLimitExceeded`` because the session it
  had just created now counts against the quota, or 5xx answers until the retries ran out): the
  session exists and is ``Created``/``Scheduled``/``Running``, so it is **adopted**: the SDK's own
  wait for ``Running``, then the SDK's ``TrainingClient`` bound to it, as the SDK itself builds one;
- **a signal arrived during the create** (``KeyboardInterrupt``; ``SystemExit`` from rlkit's SIGTERM
  handler): the session, if the service made one, is **stopped** (looked for for up to
  :data:`APPEAR_S`, since a request in flight may still be creating it), and the signal goes on;
- anything else that left a session behind (the SDK's wait for ``Running`` failed and its own stop
  failed too): the session is stopped and the create's error is raised.

A name whose create was never settled (a second Ctrl-C during the clean-up) stays on the service
client's list and ``close()`` (or the exit hook) stops it.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    from rlkit.backends.sagemaker.service import SessionService

log = logging.getLogger("rlkit.sagemaker")

ADOPTABLE = ("Created", "Scheduled", "Running")
APPEAR_S = 3.0  # after an interrupted create, how long to look for the session it may have made


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_session(
    service: "SessionService",
    base_model_arn: str,
    *,
    rank: int,
    alpha: int,
    name: Optional[str] = None,
    options: Optional[Dict[str, Any]] = None,
) -> Any:
    """``sdk.create_lora_training_client`` under a name rlkit chose, adopting or stopping the
    session if the create fails after the service made it (see the module docstring)."""
    name = name or new_name(service.session_name_prefix)
    service.ledger.session(name, region=service.region)
    service._creating.add(name)
    try:
        client = service._sdk.create_lora_training_client(
            base_model_arn, rank=rank, alpha=alpha, training_session_name=name, **(options or {})
        )
    except BaseException as exc:
        adopted = settle(service, name, exc)  # a second interrupt here leaves the name for close()
        service._creating.discard(name)
        if adopted is None:
            raise
        return adopted
    service._creating.discard(name)
    return client


def describe(service: "SessionService", name: str, *, appear_s: float = 0.0) -> Optional[Dict[str, Any]]:
    """The session's ``TrainingSessionDetail``, or ``None`` if there is no such session (after
    waiting up to ``appear_s`` for one to appear)."""
    from rlkit.backends.sagemaker.housekeeping import with_transient_retry
    from rlkit.backends.sagemaker.errors import _aws_error

    deadline = time.monotonic() + appear_s
    while True:
        try:
            return with_transient_retry(lambda: service._control().describe_training_session(TrainingSessionName=name))[
                "TrainingSessionDetail"
            ]
        except Exception as exc:  # noqa: BLE001
            code, _ = _aws_error(exc)
            if code not in ("ResourceNotFound", "ResourceNotFoundException"):
                raise
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.25)


def stop_quietly(service: "SessionService", name: str) -> None:
    """Stop ``name`` (retrying transient failures); a session already ending or gone is fine, any
    other failure is logged (the caller is already handling an error)."""
    from rlkit.backends.sagemaker.housekeeping import with_transient_retry
    from rlkit.backends.sagemaker.errors import _aws_error

    try:
        with_transient_retry(lambda: service._sdk.stop_session(name))
        log.warning("stopped SageMaker training session %s, whose creation did not complete", name)
    except Exception as exc:  # noqa: BLE001
        code, message = _aws_error(exc)
        if code in ("ResourceNotFound", "ResourceNotFoundException") or "state transition" in message:
            return
        log.warning("could not stop SageMaker training session %s (rlkit sessions stop %s): %s", name, name, message)


def settle(service: "SessionService", name: str, exc: BaseException) -> Optional[Any]:
    """After a failed create of ``name``: the adopted SDK client, or ``None`` (then the caller
    re-raises ``exc``), having stopped any session that is not adopted."""
    interrupted = not isinstance(exc, Exception)
    try:
        detail = describe(service, name, appear_s=APPEAR_S if interrupted else 0.0)
    except Exception:  # noqa: BLE001 - cannot tell; try to stop whatever may be there
        stop_quietly(service, name)
        return None
    if detail is None:
        return None  # the service made nothing: nothing leaked
    status = detail.get("TrainingSessionStatus", "")
    if interrupted or status not in ADOPTABLE:
        if status not in ("Stopping", "Stopped", "Failed", "Expired", "Deleting", "DeletionFailed"):
            stop_quietly(service, name)
        return None
    log.warning(
        "creating SageMaker training session %s failed on the client (%s), but the service created it: adopting it",
        name,
        " ".join(str(exc).split())[:300],
    )
    sdk = service._sdk
    try:
        sdk._wait_until_running_or_stop(name)  # the SDK's own wait; it stops the session if this fails
    except BaseException:  # noqa: BLE001 - the create's error is the one to report
        stop_quietly(service, name)
        return None
    from sagemaker.train.training_session import TrainingClient

    return TrainingClient(
        training_session_name=name,
        runtime=sdk._runtime,
        base_model=(detail.get("ModelConfig") or {}).get("BaseModelArn", ""),
        model_package_group_arn=detail.get("ModelPackageGroupArn", ""),
        service_client=sdk,
    )
