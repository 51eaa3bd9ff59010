"""SageMaker failures as rlkit errors: one line naming what failed, why, and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from rlkit.errors import InvalidInputError, OperationError, RlkitError

if TYPE_CHECKING:
    from rlkit.backends.sagemaker.service import SessionService

TERMINAL = ("Stopping", "Stopped", "Failed", "Expired", "Deleting", "DeletionFailed")


class SessionEndedError(OperationError):
    """The session stopped, failed or expired under a running loop. Its state is gone; resume from
    the last ``save_state`` checkpoint (``rlkit train resume=RUN_DIR`` does)."""


class SessionBlockedError(OperationError):
    """The session is ``Blocked``: an operation before this one never reached it, so nothing
    after it can run (the SDK reads ``Blocked`` as terminal). Stop it and resume."""


class QuotaExceededError(OperationError):
    """``ResourceLimitExceeded``: the account's quota of sessions (or instances) is in use."""


class OperationTimeoutError(OperationError):
    """No result within ``backend.operation_timeout_s``."""


RESUME = "Resume from the last save_state checkpoint (rlkit train resume=RUN_DIR)."


def translate(exc: BaseException, service: "SessionService", session: Optional[str], operation: str,
              *, timeout: Optional[float] = None) -> BaseException:
    """An SDK/botocore failure as an rlkit error with one line naming what failed, why, and what to do."""
    if isinstance(exc, RlkitError):
        return exc
    code, message = _aws_error(exc)
    if code in ("ResourceLimitExceeded", "ResourceLimitExceededException"):
        return QuotaExceededError(
            f"{operation}: the account's SageMaker training-session quota is used up ({message}). Stop sessions you no "
            "longer need (rlkit sessions list; rlkit sessions stop --all-active --name-contains PREFIX) or request a "
            "higher quota in Service Quotas"
        )
    status, detail = service.session_status(session) if session and code != "ParamValidationError" else ("", "")
    if status in TERMINAL:
        return SessionEndedError(f"{operation}: SageMaker training session {session} is {status}" + (f" ({detail})" if detail else "") + f". {RESUME}")
    if code in ("ValidationException", "ParamValidationError") or isinstance(exc, (ValueError, TypeError)):
        return InvalidInputError(f"{operation}: SageMaker refused the request: {message}")  # the cause, even if the session now waits
    if status == "Blocked":
        return SessionBlockedError(
            f"{operation}: SageMaker training session {session} is Blocked" + (f" ({detail})" if detail else "")
            + ": an earlier operation never reached it, so nothing after it can run. Stop it (rlkit sessions stop "
            + f"{session}) and {RESUME[0].lower()}{RESUME[1:]}"
        )
    if isinstance(exc, TimeoutError):
        where = f"; training session {session} is {status}" if status else ""
        return OperationTimeoutError(
            f"{operation}: no result from SageMaker within {timeout or 0:g} s{where}. Raise backend.operation_timeout_s "
            "if operations this large take longer, or stop the session and resume"
        )
    return OperationError(f"{operation} failed on SageMaker ({code or type(exc).__name__}): {message}")


def _aws_error(exc: BaseException) -> tuple:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error") or {}
        return err.get("Code") or "", " ".join(str(err.get("Message") or exc).split())
    name = type(exc).__name__
    if name == "ParamValidationError":
        return name, " ".join(str(exc).split())
    return "", " ".join(str(exc).split())
