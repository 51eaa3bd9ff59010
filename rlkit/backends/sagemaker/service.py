"""What the SageMaker clients need from the service client that made them, declared once.

:class:`~rlkit.backends.sagemaker.adapter.SageMakerServiceClient` implements it. The training and
sampling clients, session creation and error translation type against this protocol instead of
importing the adapter, so the package's imports run one way: ``adapter -> training, sampling,
creation -> service``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Protocol


class SessionService(Protocol):
    """The service side of a SageMaker training or sampling client."""

    region: str
    session_name_prefix: str
    min_max_tokens: int
    operation_timeout_s: float
    trainer_logprobs: str
    always_score_logprobs: bool
    keep_published_weights: bool
    ledger: Any
    _sdk: Any  # the SDK's client (session creation adopts through it)
    _creating: Any  # names of sessions being created, settled at close or exit

    def submit(self, call: Callable[[], Any], parse: Callable[[Any], Any], operation: str, session: Optional[str],
               *, on_error: Optional[Callable[[BaseException, Any], None]] = None) -> Any:
        """Run an SDK call; an :class:`~rlkit.futures.APIFuture` of ``parse(result)``, errors translated."""

    def run(self, fn: Callable[[], Any], operation: str, session: Optional[str]) -> Any:
        """``fn()`` on the service's waiter pool, as a future, errors translated."""

    def get_tokenizer(self, base_model: str) -> Any:
        """The tokenizer of a base model."""

    def session_status(self, name: str) -> tuple:
        """``(status, detail)`` of a training session (``("", "")`` when it cannot be read)."""

    def billing(self, name: str) -> Dict[str, int]:
        """The session's billed token usage, read now."""

    def billing_snapshot(self, name: str) -> Dict[str, int]:
        """The last billed usage read in the background."""

    def refresh_billing(self, name: str) -> None:
        """Read the bill again in the background (never fails training)."""

    def delete_package_later(self, save_future: Any) -> None:
        """Delete the model package a save produces once it is no longer used."""

    def _control(self) -> Any:
        """The SDK's control-plane boto3 client."""

    def _stop_sdk(self, sdk_client: Any, name: str) -> None:
        """Stop one SDK session (idempotent; a failing stop never replaces an error in flight)."""
