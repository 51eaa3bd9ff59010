"""The service client's background chores: the bill, and deleting packages rlkit made for itself.

Both run off the loop's thread and never fail a training operation:

- **billing** (``DescribeTrainingSession.BillableTokenUsage``) is read at most once per step, after
  each ``optim_step``, in the background; results carry the last bill read (``billing/*``), so it lags
  a step. A failed read is logged at debug level and changes nothing.
- **deletions** of the packages rlkit saved only for itself (scoring weights, superseded published
  weights) run on a small pool; ``close()`` waits for them (up to ``CLOSE_WAIT_S``); a failure is a
  warning, and ``rlkit sessions cleanup RUN_DIR`` finds what is left.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict

from rlkit.futures import APIFuture

log = logging.getLogger("rlkit.sagemaker")


def with_transient_retry(fn: Callable[[], Any], attempts: int = 6) -> Any:
    """``fn()``, retrying what the SDK calls retryable (throttling, 5xx, connection errors) with
    its jittered backoff: botocore's own 4 attempts are not always enough for a stop."""
    from sagemaker.train.training_session.futures import call_with_transient_retry

    return call_with_transient_retry(fn, max_attempts=attempts)


class Housekeeping:
    """Mixed into :class:`~.adapter.SageMakerServiceClient` (which sets the attributes used here)."""

    def billing(self, name: str) -> Dict[str, int]:
        """The session's ``BillableTokenUsage`` (cumulative tokens the service will bill)."""
        detail = self._control().describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
        usage = detail.get("BillableTokenUsage") or {}
        return {
            "prefill_tokens": int(usage.get("PrefillTokenCount") or 0),
            "sample_tokens": int(usage.get("SampleTokenCount") or 0),
            "training_tokens": int(usage.get("TrainingTokenCount") or 0),
        }

    def billing_snapshot(self, name: str) -> Dict[str, int]:
        """The last bill read for ``name`` (``{}`` before the first read, or with billing off)."""
        return dict(self._billing.get(name, {})) if self.billing_metrics else {}

    def refresh_billing(self, name: str) -> None:
        """Read ``name``'s bill once, in the background (called after each ``optim_step``, so at
        most once per step). A failed read is logged at debug level and changes nothing."""
        if not self.billing_metrics or self._closed:
            return
        with self._lock:
            if name in self._billing_inflight:
                return
            self._billing_inflight.add(name)

        def read() -> None:
            try:
                self._billing[name] = self.billing(name)
            except Exception as exc:  # noqa: BLE001 - a metrics fetch never fails training
                log.debug("could not read the bill of session %s: %s", name, exc)
            finally:
                with self._lock:
                    self._billing_inflight.discard(name)

        try:
            self._waiters.submit(read)
        except RuntimeError:  # the pool is shutting down
            with self._lock:
                self._billing_inflight.discard(name)

    def delete_package(self, model_package_arn: str) -> None:
        """Delete a model package rlkit created for itself (its S3 artifacts too with
        ``delete_artifacts``); failures are logged, never raised."""
        if self._finished:  # after close(): left for `rlkit sessions cleanup RUN_DIR`
            log.debug("not deleting %s after close(); rlkit sessions cleanup RUN_DIR will", model_package_arn)
            return
        try:
            self._sdk.delete_model_package(model_package_arn, delete_artifacts=self.delete_artifacts)
        except Exception as exc:  # noqa: BLE001 - housekeeping never fails a loop
            log.warning(
                "could not delete model package %s (rlkit sessions cleanup RUN_DIR retries): %s", model_package_arn, exc
            )

    def delete_package_later(self, save_future: APIFuture) -> None:
        """Delete the package a save future resolves to, once it has (in the background; close()
        waits for these)."""

        def delete() -> None:
            if save_future.exception(timeout=self.operation_timeout_s) is None:
                self.delete_package(save_future.result().model_package_arn)

        try:
            pending = self._housekeeping.submit(delete)
        except RuntimeError:  # shut down
            return
        with self._lock:
            self._deletions.add(pending)
        pending.add_done_callback(lambda f: self._deletions.discard(f))
