"""rlkit's session API over the official SDK, ``sagemaker.train.training_session`` (1.27.0).

``rlkit.connect("sagemaker", region=..., role_arn=..., model_package_group_arn=...,
s3_output_path=..., kms_key_arn=..., vpc_config=...)`` returns a :class:`SageMakerServiceClient`.
Loops written against :mod:`rlkit.engine` run on it unchanged; what differs from the local
backend, and how the adapter bridges it:

- **base models** are SageMaker Public Hub models (a model id from ``list_base_models()`` or a
  hub-content ARN). rlkit's local names ``tiny`` / ``smollm2-135m-instruct`` map to the
  emulator's hub-content ARNs (:mod:`.names`), so ``model=tiny backend=sagemaker`` runs against
  ``rlkit emulate sagemaker``.
- **checkpoints** are model-package ARNs. The LoRA shape is appended to each saved description
  (``[rlkit lora rank=R alpha=A]``) so a later process can restore a session of the same shape
  (``create_training_client_from_state*``) from the ARN alone.
- **max_tokens >= 512** at the service: shorter requests are sampled at 512 and cut on the client
  (same tokens and logprobs; the extra decoded tokens are billed and reported in ``usage``).
- **losses**: the four built-ins run natively; any other :class:`~rlkit.losses.Loss` (passed to
  ``forward_backward`` or through :func:`rlkit.losses.run_loss`) runs through the linearised
  path (``forward`` + ``forward_backward("cross_entropy", weights=-dL/dlogp)``).
- ``seed`` / ``train_attn`` / ``train_mlp`` are not settable on the service (it seeds LoRA and
  picks the layer set); they are accepted and not sent.
- **usage and billing**: ``forward_backward`` results carry the service's ``trainingTokens`` and,
  with ``billing_metrics=True``, the session's cumulative ``BillableTokenUsage`` as
  ``billing/{prefill,sample,training}_tokens`` metrics, read once per step in the background
  (:mod:`.housekeeping`).
- **trainer logprobs**: ``forward`` results always carry them, ``forward_backward`` results only
  when asked (``return_logprobs=True``) or when the service returns them: the service's, else
  scored with the session (:mod:`.scoring`); metrics read the same on either reading of the
  service (:mod:`.outputs`).
- **hygiene**: every session this client creates is stopped by ``stop()``/``close()``, on
  exceptions through the loops' ``finally``, on SIGINT/SIGTERM and at exit (:mod:`.hygiene`); a
  create that fails after the service made the session adopts or stops it (:mod:`.creation`).
- **the emulator** is recognised by its handshake (or ``emulator=True``), never by an endpoint
  override alone: a VPC endpoint URL is SageMaker.

Every call returns an :class:`~rlkit.futures.APIFuture` at once; SDK futures are awaited on a
small thread pool and their failures become rlkit errors (:func:`.sampling.translate`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional

from rlkit.backends.sagemaker import convert, creation, hygiene, names, scoring
from rlkit.backends.sagemaker.housekeeping import Housekeeping, with_transient_retry
from rlkit.backends.sagemaker.ledger import Ledger
from rlkit.backends.sagemaker.sampling import SageMakerSamplingClient, _aws_error, translate
from rlkit.backends.sagemaker.capabilities import SAGEMAKER_CAPABILITIES
from rlkit.backends.sagemaker.training import SageMakerTrainingClient
from rlkit.engine.capabilities import Capabilities
from rlkit.engine.checks import LoraRequest
from rlkit.engine.service import ServiceClientBase
from rlkit.errors import RlkitWarning
from rlkit.errors import BackendUnavailableError, CheckpointNotFoundError, ClientStoppedError, ConfigError
from rlkit.futures import APIFuture

log = logging.getLogger("rlkit.sagemaker")

ENDPOINT_ENV = "SAGEMAKER_TRAINING_SESSION_ENDPOINT"
RUNTIME_ENDPOINT_ENV = "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT"
EMULATOR_ROLE = f"arn:aws:iam::{names.EMULATOR_ACCOUNT}:role/rlkit-emulator"
EMULATOR_S3 = "s3://rlkit-emulator/output"
CLOSE_WAIT_S = 30.0  # close() waits this long for deletions of packages rlkit created for itself
STOPPED_ENOUGH = ("Stopping", "Stopped", "Failed", "Expired", "Deleting", "DeletionFailed")
SDK_DEFAULT_RANK, SDK_DEFAULT_ALPHA = 32, 64  # the SDK's create_sampling_client sessions (types.DEFAULT_LORA_*)


def _import_sdk() -> Any:
    try:
        from sagemaker.train import training_session
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the sagemaker backend needs the sagemaker-train SDK: pip install 'rlkit[sagemaker]' ({exc})"
        ) from None
    return training_session


class SageMakerServiceClient(Housekeeping, ServiceClientBase):
    """Entry point of the SageMaker backend (``rlkit.connect("sagemaker", ...)``).

    Args:
        region: AWS Region (default: ``AWS_REGION`` / ``AWS_DEFAULT_REGION``; ``us-west-2`` when
            an endpoint override points at the emulator).
        role_arn: IAM role the sessions run as (required on SageMaker).
        model_package_group_arn: where checkpoints are registered (default: the account's
            ``sagemaker-default`` group, created on first use).
        s3_output_path, kms_key_arn, vpc_config: session outputs, their KMS key, the VPC.
        endpoint, runtime_endpoint: endpoint overrides (an interface VPC endpoint, or the
            emulator's URL); set as ``SAGEMAKER_TRAINING_SESSION_[RUNTIME_]ENDPOINT``, which is how
            the SDK takes them.
        emulator: ``None`` (default): the endpoint is rlkit's emulator only if it answers the
            emulator's handshake (``GET /_emulator/health``), never because an override is set;
            ``True``/``False`` says so without asking. Only the emulator gets a placeholder role,
            dummy credentials, a placeholder S3 path and rlkit's local base models.
        session_name_prefix: sessions are named ``<prefix>-<8 hex>``.
        base_models: extra ``{alias: model id or hub-content ARN}`` for ``base_model`` values.
        tokenizer: a tokenizer (object, local path or HF id) for base models the adapter cannot
            resolve itself (default: the emulator's local tokenizers, else the SDK's lookup).
        min_max_tokens: the service's ``max_tokens`` floor (512).
        billing_metrics: add the session's ``BillableTokenUsage`` to ``forward_backward`` metrics
            (read once per ``optim_step``, in the background; a failed read never fails training).
        trainer_logprobs: where ``forward``/``forward_backward`` logprobs come from: ``auto``
            (the service's, if its first result carries them, else scored with the session),
            ``service`` or ``scoring`` (see :mod:`.scoring`).
        always_score_logprobs: score the trainer's logprobs after every ``forward_backward`` too,
            not only when asked (``return_logprobs=True``): rlkit's old behaviour, a
            ``compute_logprobs`` round trip per pass (for comparisons).
        operation_timeout_s: how long to wait for one operation's result (``None``: forever).
        keep_published_weights: keep every package ``save_weights_and_get_sampling_client``
            publishes (default: delete one once superseded and unused).
        delete_artifacts: when rlkit deletes a package, delete its S3 artifacts too.
        checkpoint_dir: where to record the sessions and packages this client creates
            (:mod:`.ledger`; a run sets it to ``<run_dir>/checkpoints``).
        handle_signals: install the SIGTERM handler of :mod:`.hygiene`.
        precision: accepted so recipes written for ``local`` compose; the service picks its own.
        num_threads: torch threads for client-side work (linearised losses).
    """

    def __init__(
        self,
        *,
        region: Optional[str] = None,
        role_arn: Optional[str] = None,
        model_package_group_arn: Optional[str] = None,
        s3_output_path: Optional[str] = None,
        kms_key_arn: Optional[str] = None,
        vpc_config: Optional[Dict[str, Any]] = None,
        endpoint: Optional[str] = None,
        runtime_endpoint: Optional[str] = None,
        session_name_prefix: str = "rlkit",
        base_models: Optional[Dict[str, str]] = None,
        tokenizer: Any = None,
        min_max_tokens: int = names.SERVICE_MIN_MAX_TOKENS,
        billing_metrics: bool = True,
        trainer_logprobs: str = "auto",
        always_score_logprobs: bool = False,
        operation_timeout_s: Optional[float] = 3600.0,
        keep_published_weights: bool = False,
        delete_artifacts: bool = False,
        checkpoint_dir: Optional[str] = None,
        emulator: Optional[bool] = None,
        handle_signals: bool = True,
        precision: Optional[str] = None,
        num_threads: Optional[int] = None,
        max_pool_connections: Optional[int] = None,
        max_waiters: int = 64,
    ):
        _quiet_sdk_logs()
        sdk = _import_sdk()
        if endpoint:
            os.environ[ENDPOINT_ENV] = endpoint
            os.environ[RUNTIME_ENDPOINT_ENV] = runtime_endpoint or endpoint
        elif runtime_endpoint:
            os.environ[RUNTIME_ENDPOINT_ENV] = runtime_endpoint
        url = os.environ.get(ENDPOINT_ENV)
        if emulator is None:  # never the variable alone: a VPC endpoint URL is SageMaker itself
            self.emulated = bool(url) and answers_handshake(url)
        else:
            self.emulated = bool(emulator)
            if self.emulated and not url:
                raise ConfigError("backend.emulator=true needs the emulator's URL: backend.endpoint=http://HOST:PORT "
                                  f"(or {ENDPOINT_ENV})")
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ("us-west-2" if self.emulated else None)
        if not region:
            raise ConfigError("backend.region is not set (nor AWS_REGION): name the Region that runs your training sessions")
        if not role_arn and self.emulated:
            role_arn = EMULATOR_ROLE
        self.role_arn = role_arn  # only creating a session needs it; list/stop/cleanup do not
        if self.emulated:
            s3_output_path = s3_output_path or EMULATOR_S3
            _dummy_credentials_if_none()
        if num_threads:
            import torch

            torch.set_num_threads(int(num_threads))
        if precision not in (None, "fp32", "auto"):
            log.info("backend.precision=%s is not sent to SageMaker: the service chooses its own precision", precision)
        if trainer_logprobs not in scoring.SOURCES:
            raise ConfigError(f"backend.trainer_logprobs={trainer_logprobs!r} must be one of {list(scoring.SOURCES)}")
        if operation_timeout_s is not None and not operation_timeout_s > 0:
            raise ConfigError(f"backend.operation_timeout_s={operation_timeout_s!r} must be a positive number of seconds (or null)")
        self.region = region
        self.base_models = dict(base_models or {})
        self.min_max_tokens = int(min_max_tokens)
        self.billing_metrics = bool(billing_metrics)
        self.trainer_logprobs = trainer_logprobs
        self.always_score_logprobs = bool(always_score_logprobs)
        self.operation_timeout_s = None if operation_timeout_s is None else float(operation_timeout_s)
        self.keep_published_weights = bool(keep_published_weights)
        self.delete_artifacts = bool(delete_artifacts)
        self.ledger = Ledger(checkpoint_dir)
        self._billing: Dict[str, Dict[str, int]] = {}
        self._billing_inflight: set = set()
        self._housekeeping = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="rlkit-sagemaker-housekeeping")
        self._deletions: set = set()
        self._finished = False
        self._unstopped: Dict[str, Any] = {}  # session name -> SDK client whose stop failed
        self._creating: set = set()  # names whose create has not been settled (see .creation)
        self.session_name_prefix = session_name_prefix
        self._tokenizer_option = tokenizer
        self._tokenizers: Dict[str, Any] = {}
        kwargs: Dict[str, Any] = dict(
            role_arn=role_arn or "", model_package_group_arn=model_package_group_arn, s3_output_path=s3_output_path,
            kms_key_arn=kms_key_arn, vpc_config=dict(vpc_config) if vpc_config else None, session_name_prefix=session_name_prefix,
        )
        if max_pool_connections:
            kwargs["max_pool_connections"] = int(max_pool_connections)
        self._sdk = sdk.ServiceClient(region, **kwargs)
        self._waiters = concurrent.futures.ThreadPoolExecutor(max_workers=max_waiters, thread_name_prefix="rlkit-sagemaker-wait")
        self._lock = threading.Lock()
        ServiceClientBase.__init__(self)  # the registry of the clients that own a session
        hygiene.register(self, handle_signals=handle_signals)

    # -- plumbing shared by the clients -------------------------------------------------------------
    def submit(self, call: Callable[[], Any], parse: Callable[[Any], Any], operation: str, session: Optional[str],
               *, on_error: Optional[Callable[[BaseException, Any], None]] = None) -> APIFuture:
        """Run the SDK call now (it returns an SDK future at once); resolve an rlkit future from it,
        waiting at most ``operation_timeout_s``. ``on_error(err, sdk_future)`` sees a failure first."""
        if self._closed:
            raise ClientStoppedError(f"{operation}: this SageMaker service client was closed")
        try:
            sdk_future = call()
        except Exception as exc:  # noqa: BLE001 - the SDK refused the call at the call site
            raise translate(exc, self, session, operation) from exc
        out: APIFuture = APIFuture(operation=operation)
        timeout = self.operation_timeout_s

        def wait() -> None:
            try:
                value = parse(sdk_future.result(timeout=timeout))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                err = translate(exc, self, session, operation, timeout=timeout)
                if err is not exc:
                    err.__cause__ = exc
                if on_error is not None:
                    on_error(err, sdk_future)
                out.set_exception(err)
            else:
                out.set_result(value)

        self._waiters.submit(wait)
        return out

    def run(self, fn: Callable[[], Any], operation: str, session: Optional[str]) -> APIFuture:
        """``fn()`` on the waiter pool, its failure translated as :meth:`submit`'s are."""
        out: APIFuture = APIFuture(operation=operation)

        def call() -> None:
            try:
                value = fn()
            except BaseException as exc:  # noqa: BLE001 - delivered through the future
                err = translate(exc, self, session, operation, timeout=self.operation_timeout_s)
                if err is not exc:
                    err.__cause__ = exc
                out.set_exception(err)
            else:
                out.set_result(value)

        self._waiters.submit(call)
        return out

    def _control(self) -> Any:
        return self._sdk._sagemaker_client  # the SDK's control-plane boto3 client

    def session_status(self, name: str) -> tuple:
        """``(TrainingSessionStatus, ErrorDetails)`` of ``name`` (``("", "")`` if it cannot be read)."""
        try:
            detail = self._control().describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
        except Exception:  # noqa: BLE001
            return "", ""
        return detail.get("TrainingSessionStatus", ""), detail.get("ErrorDetails", "")

    def resolve_base_model(self, base_model: str) -> str:
        """``backend.base_models`` aliases; on the emulator also rlkit's local names (``tiny``)."""
        if not self.emulated:
            return self.base_models.get(base_model, base_model)
        return names.alias_to_arn(base_model, self.region, self.base_models)

    def get_tokenizer(self, base_model: str) -> Any:
        """The tokenizer of ``base_model`` (an rlkit name, a model id or a hub-content ARN)."""
        if base_model in self._tokenizers:
            return self._tokenizers[base_model]
        option = self._tokenizer_option
        if option is not None and not isinstance(option, str):
            tokenizer = option
        elif isinstance(option, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(option)
        else:
            local = names.local_model_for_arn(self.resolve_base_model(base_model)) if self.emulated else None
            if local is not None:
                from rlkit.backends.local.models import load_tokenizer

                tokenizer = load_tokenizer(local)
            else:
                from sagemaker.train.training_session._utils import (
                    load_tokenizer as sdk_load_tokenizer,
                )

                tokenizer = sdk_load_tokenizer(self.resolve_base_model(base_model), self._sdk._get_hub_client())
        self._tokenizers[base_model] = tokenizer
        return tokenizer

    def _forget_name(self, name: str) -> None:
        for client in self._running():
            if client.name == name:
                self._forget(client)

    def _stop_sdk(self, sdk_client: Any, name: str) -> None:
        """Stop the SDK client's session, retrying throttling and 5xx answers; a session the
        service already ended counts as stopped. If it cannot be stopped, ``close()`` (and the
        interpreter's exit) tries again; and while another exception is on its way out (a stop in
        a loop's ``finally``), the stop's failure is logged instead of raised, so the first error is
        the one reported."""
        try:
            with_transient_retry(sdk_client.stop)
        except Exception as exc:  # noqa: BLE001
            code, message = _aws_error(exc)
            status, _ = self.session_status(name)
            if (code == "ValidationException" and "state transition" in message) or status in STOPPED_ENOUGH:
                self._forget_name(name)
                return
            self._unstopped[name] = sdk_client
            self._forget_name(name)
            err = translate(exc, self, None, f"stop session {name}")
            if sys.exc_info()[1] is not None:
                log.warning("%s (rlkit retries at exit; else: rlkit sessions stop %s)", err, name)
                return
            raise err from exc
        self._unstopped.pop(name, None)
        self._forget_name(name)

    def _retry_unstopped(self) -> List[BaseException]:
        errors = []
        for name, sdk_client in list(self._unstopped.items()):
            try:
                self._stop_sdk(sdk_client, name)
            except Exception as exc:  # noqa: BLE001 - reported by close()
                errors.append(exc)
        return errors

    # -- sessions -----------------------------------------------------------------------------------
    def _check_open(self, creating: bool = True) -> None:
        """The base's check (closed: refused alike on every engine), then SageMaker's precondition."""
        super()._check_open()
        if creating and not self.role_arn:
            raise ConfigError("backend.role_arn is required to create SageMaker training sessions: the IAM role they run as "
                              "(see docs/sagemaker.md, 'What you need')")

    def _create_lora(self, request: LoraRequest) -> SageMakerTrainingClient:
        """Create a training session (blocks until it is Running) and return its client (checked by
        :meth:`rlkit.engine.service.ServiceClientBase.create_lora_training_client`). Session options
        ``model_package_group_arn``, ``s3_output_path``, ``kms_key_arn``, ``vpc_config`` override
        the service client's defaults for this session."""
        base_model, rank, alpha, seed = request.base_model, request.rank, request.alpha, request.seed
        training_session_name = request.name
        session_options = {k: v for k, v in request.options.items() if k != "user_metadata"}
        if seed is not None and not self.emulated:
            warnings.warn(f"seed={seed} is not sent: SageMaker seeds LoRA initialisation itself, so this session's "
                          "initial adapter differs from a local run's with the same seed", RlkitWarning, stacklevel=2)
        arn = self.resolve_base_model(base_model)
        try:
            sdk_tc = creation.create_session(self, arn, rank=rank, alpha=alpha, name=training_session_name, options=session_options)
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, self, None, "create_lora_training_client") from exc
        return self._wrap_training(sdk_tc, base_model, rank, alpha)

    def _wrap_training(self, sdk_tc: Any, base_model: str, rank: int, alpha: int) -> SageMakerTrainingClient:
        client = SageMakerTrainingClient(self, sdk_tc, base_model=base_model, rank=rank, alpha=alpha)
        self._track(client)  # after close(): the client is stopped (so is its session) and refused
        log.info("SageMaker training session %s is Running (%s, LoRA rank %d)", client.name, base_model, rank)
        return client

    def describe_checkpoint(self, model_package_arn: str) -> Dict[str, Any]:
        """``{"base_model_arn", "base_model", "rank", "alpha", "kind", "description"}`` of a checkpoint."""
        try:
            desc = self._sdk._get_model_registry_client().describe_model_package(ModelPackageName=model_package_arn)
        except Exception as exc:  # noqa: BLE001
            code, message = _aws_error(exc)
            raise CheckpointNotFoundError(f"no checkpoint {model_package_arn!r} on SageMaker ({code}: {message})") from None
        from sagemaker.train.training_session._utils import (
            base_model_arn_from_model_package,
        )

        base_arn = base_model_arn_from_model_package(desc, self.region)
        container = ((desc.get("InferenceSpecification") or {}).get("Containers") or [{}])[0]
        lora = names.lora_from_description(desc.get("ModelPackageDescription"))
        local = names.local_model_for_arn(base_arn) if self.emulated else None
        alias = next((k for k, v in self.base_models.items() if v == base_arn), None)
        return {
            "base_model_arn": base_arn,
            "base_model": alias or local or base_arn,
            "rank": lora[0] if lora else None,
            "alpha": lora[1] if lora else None,
            "kind": "checkpoint" if container.get("IsCheckpoint") else "model",
            "description": desc.get("ModelPackageDescription", ""),
        }

    def _checkpoint_shape(self, checkpoint: str) -> Dict[str, Any]:
        """A checkpoint's base model and LoRA shape, read from its model package (rlkit's tag)."""
        info = self.describe_checkpoint(checkpoint)
        return {"base_model": info["base_model"], "rank": info["rank"], "alpha": info["alpha"]}

    def _create_sampling_client(self, base_model: Optional[str], model_package_arn: Optional[str]) -> SageMakerSamplingClient:
        """A sampler on ``base_model`` or on a checkpoint (exactly one is given:
        :meth:`rlkit.engine.service.ServiceClientBase.create_sampling_client`), in a session of its
        own (stopped by its ``stop()`` or by ``close()``)."""
        try:  # what the SDK's create_sampling_client does (a session of the SDK's default LoRA shape), with rlkit's creation
            if model_package_arn:
                info = self.describe_checkpoint(model_package_arn)
                alias, arn = info["base_model"], info["base_model_arn"]
            else:
                alias, arn = base_model, self.resolve_base_model(base_model)
            owner = creation.create_session(self, arn, rank=SDK_DEFAULT_RANK, alpha=SDK_DEFAULT_ALPHA)
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, self, None, "create_sampling_client") from exc
        sdk_sc = owner.create_sampling_client(model_package_arn or "")
        client = SageMakerSamplingClient(self, sdk_sc, base_model=alias, owns_session=True, owner=owner)
        self._track(client)
        return client

    def list_base_models(self) -> List[str]:
        if self.emulated:
            return sorted(set(names.EMULATOR_MODELS) | set(self.base_models))
        return self._sdk.list_base_models()

    @property
    def capabilities(self) -> Capabilities:
        return SAGEMAKER_CAPABILITIES

    def list_sessions(self, *, status: Optional[str] = None, name_contains: Optional[str] = None) -> List[Dict[str, Any]]:
        """Sessions of this account and Region, newest first."""
        out = []
        for s in self._sdk.list_sessions(status_equals=status, name_contains=name_contains):
            out.append({
                "training_session_name": s.training_session_name,
                "status": getattr(s.status, "value", s.status),
                "creation_time": s.creation_time,
                "training_session_arn": s.training_session_arn,
            })
        return out

    def _stop_untracked(self, name: str) -> None:
        """Stop a session this client does not hold, by name (idempotent for sessions already
        stopping or stopped)."""
        try:
            with_transient_retry(lambda: self._sdk.stop_session(name))
        except Exception as exc:  # noqa: BLE001
            code, message = _aws_error(exc)
            if code == "ValidationException" and "state transition" in message:
                return  # already stopping or over (the SDK absorbs only some of these states)
            raise translate(exc, self, None, f"stop session {name}") from exc

    def _close(self, first: bool) -> List[BaseException]:
        """Retry the stops that failed before; on the first close also settle interrupted
        creates, wait for the package deletions and shut the pools down."""
        errors = self._retry_unstopped()
        if not first:
            return errors
        for name in list(self._creating):  # a create interrupted before it could be settled
            creation.stop_quietly(self, name)
            self._creating.discard(name)
        concurrent.futures.wait(list(self._deletions), timeout=CLOSE_WAIT_S)  # packages rlkit no longer needs
        self._finished = True
        self._housekeeping.shutdown(wait=False, cancel_futures=True)
        self._waiters.shutdown(wait=False)
        if not self._unstopped:
            hygiene.unregister(self)  # else the exit hook tries once more
        return errors

    def __enter__(self) -> "SageMakerServiceClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def answers_handshake(url: str, timeout: float = 3.0) -> bool:
    """Whether ``url`` is rlkit's emulator: it answers ``GET /_emulator/health`` with the handshake.
    Anything else (an error status, no answer within ``timeout``, other JSON) is not."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + names.HANDSHAKE_PATH, timeout=timeout) as reply:
            body = json.loads(reply.read(65536) or b"{}")
    except Exception:  # noqa: BLE001 - whatever fails, it is not the emulator
        return False
    return isinstance(body, dict) and body.get("emulator") == names.EMULATOR_HANDSHAKE


def _quiet_sdk_logs() -> None:
    """The SDK and botocore log every Region resolution and credential lookup at INFO (and warn
    about ``http://`` endpoints on each client); keep loops' consoles for the loop. Loggers a user
    configured are left alone."""
    quiet = {"sagemaker.config": logging.WARNING, "botocore.credentials": logging.WARNING,
             "sagemaker.train.training_session._endpoints": logging.ERROR}
    for name, level in quiet.items():
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(level)


def _dummy_credentials_if_none() -> None:
    """The emulator ignores signatures, but botocore refuses to send unsigned requests."""
    import boto3

    if boto3.Session().get_credentials() is None:
        log.info("no AWS credentials found; using dummy ones for the emulator endpoint")
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "rlkit-emulator")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "rlkit-emulator")


__all__ = ["SageMakerServiceClient", "SageMakerTrainingClient", "SageMakerSamplingClient", "convert"]
