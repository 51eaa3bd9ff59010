"""rlkit's session API over the official ``tinker`` SDK (0.38.0).

``rlkit.connect("tinker", api_key=..., base_url=...)`` returns a :class:`TinkerServiceClient`;
loops written against :mod:`rlkit.session` run on it unchanged, on Thinking Machines' service or
on ``rlkit serve tinker``. What differs between the two SDKs, and how it is bridged:

- **creation returns futures** in Tinker (``create_lora_training_client(...).result()``); here the
  ``create_*`` calls return clients, as rlkit's contract says.
- **rank only**: Tinker has no LoRA ``alpha``: the service fixes the scale at alpha 32 / rank
  (``lora_alpha=`` declares another for a server started so, e.g. ``rlkit serve tinker
  --lora-alpha``). ``alpha`` is not sent; any other value than the service's is refused in one line,
  so a loop trains the same model here as on local and SageMaker (rlkit's default alpha is 32). ``seed``, ``train_mlp``, ``train_attn`` are sent; ``train_unembed`` is sent as
  rlkit's default, ``False``, unless asked for (Tinker's default is ``True``).
- **loss_fn is required** in Tinker and ``loss_fn_config`` is its third positional: always sent.
- **RL losses without weights**, **AdamParams defaults**, **temperature**: :mod:`.convert`.
- **save_state's first positional is a name** in Tinker, a description here: bridged by
  :func:`.convert.checkpoint_name`. Checkpoints are ``tinker://`` paths; **loading means a new
  training client from the path**, so ``load_state*`` moves the rlkit client to a new Tinker one.
- **losses**: the four built-ins whose maths is rlkit's run natively (tests compare their
  gradients with rlkit's own loss objects); every other :class:`~rlkit.losses.Loss` runs
  linearised (``forward``, then ``forward_backward("cross_entropy", weights=-dL/dlogp)``).
- **sessions**: every client this service creates lives in one Tinker session, finished by
  ``close()`` — also at interpreter exit, and through the loops' ``finally`` on every exit path.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Any, Dict, List, Optional

from rlkit.backends.tinker.clients import TinkerSamplingClient, TinkerTrainingClient, call
from rlkit.errors import BackendUnavailableError, ClientStoppedError, InvalidInputError
from rlkit.backends.tinker.capabilities import TINKER_ALPHA, tinker_capabilities
from rlkit.session import LoraRequest, ServiceClientBase

log = logging.getLogger("rlkit.tinker")
def _import_sdk() -> Any:
    try:
        import tinker
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the tinker backend needs the tinker SDK: pip install 'rlkit[tinker]' ({exc})"
        ) from None
    return tinker


class TinkerServiceClient(ServiceClientBase):
    """Entry point of the tinker backend (``rlkit.connect("tinker", ...)``).

    Args:
        api_key: a Tinker API key (``tml-...``); default ``$TINKER_API_KEY``.
        base_url: the service (default ``$TINKER_BASE_URL``, else Thinking Machines'); point it at
            ``rlkit serve tinker`` to run on this machine.
        base_models: extra ``{alias: Tinker model name}`` for ``base_model`` values.
        tokenizer: a tokenizer (object, local path or HF id) to use instead of the SDK's lookup.
        precision, num_threads: accepted so recipes written for ``local`` compose; the service
            picks its precision, threads are the client's (linearised losses).
        lora_alpha: the service's fixed LoRA alpha (32 on Thinking Machines' service; whatever a
            ``rlkit serve tinker --lora-alpha`` server was started with).
    """

    def __init__(
        self,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        base_models: Optional[Dict[str, str]] = None,
        tokenizer: Any = None,
        precision: Optional[str] = None,
        num_threads: Optional[int] = None,
        user_metadata: Optional[Dict[str, str]] = None,
        lora_alpha: int = TINKER_ALPHA,
    ):
        tinker = _import_sdk()
        if not isinstance(lora_alpha, int) or isinstance(lora_alpha, bool) or lora_alpha < 1:
            raise InvalidInputError(f"backend.lora_alpha={lora_alpha!r} must be a positive integer (the service's LoRA alpha)")
        self._capabilities = tinker_capabilities(lora_alpha)
        if api_key is not None and not str(api_key).startswith(("tml-", "eyJ")):
            raise InvalidInputError("backend.api_key: Tinker API keys start with 'tml-'")
        if num_threads:
            import torch

            torch.set_num_threads(int(num_threads))
        self.base_models = dict(base_models or {})
        self._tokenizer = tokenizer
        self._tokenizers: Dict[str, Any] = {}
        self.sdk = tinker.ServiceClient(base_url=base_url, api_key=api_key, user_metadata=user_metadata)
        self._clients: Dict[int, TinkerTrainingClient] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, _finish, self.sdk, "interrupted")
        atexit.register(self._finalizer)

    @property
    def capabilities(self):
        """What this service honours (:func:`.capabilities.tinker_capabilities`, with its fixed alpha)."""
        return self._capabilities

    def resolve_base_model(self, base_model: str) -> str:
        return self.base_models.get(base_model, base_model)

    def get_tokenizer(self, base_model: str, sdk_trainer: Any = None) -> Any:
        """The tokenizer of ``base_model``: ``tokenizer=`` if given, else the SDK's (from the
        training run's ``get_info``, else by the model's name)."""
        if self._tokenizer is not None:
            if isinstance(self._tokenizer, str):
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer)
            return self._tokenizer
        if base_model not in self._tokenizers:
            if sdk_trainer is not None:
                self._tokenizers[base_model] = call(sdk_trainer.get_tokenizer, "get_tokenizer")
            else:
                from transformers import AutoTokenizer

                self._tokenizers[base_model] = call(
                    lambda: AutoTokenizer.from_pretrained(self.resolve_base_model(base_model)), "get_tokenizer"
                )
        return self._tokenizers[base_model]

    def _check_open(self) -> None:
        if self._closed:
            raise ClientStoppedError("this service client was closed")

    def _track(self, sdk_trainer: Any, base_model: str) -> TinkerTrainingClient:
        info = sdk_trainer.get_info()
        client = TinkerTrainingClient(self, sdk_trainer, base_model, int(info.lora_rank or 0))
        with self._lock:
            self._clients[id(client)] = client
        return client

    def _forget(self, client: TinkerTrainingClient) -> None:
        with self._lock:
            self._clients.pop(id(client), None)

    def _create_lora(self, request: LoraRequest) -> TinkerTrainingClient:
        """A new LoRA training run (checked by :meth:`rlkit.session.ServiceClientBase.create_lora_training_client`).
        ``alpha`` is not sent (Tinker has rank only): the front door refused any other than the
        service's fixed alpha (32, or ``lora_alpha=`` given to ``connect``)."""
        base_model, rank, seed = request.base_model, request.rank, request.seed
        train_mlp, train_attn, train_unembed = request.train_mlp, request.train_attn, request.train_unembed
        model = self.resolve_base_model(base_model)
        sdk_trainer = call(
            lambda: self.sdk.create_lora_training_client(
                model,
                rank,
                seed,
                True if train_mlp is None else bool(train_mlp),
                True if train_attn is None else bool(train_attn),
                bool(train_unembed),
            ).result(),
            "create_lora_training_client",
        )
        return self._track(sdk_trainer, base_model)

    def create_training_client_from_state(self, model_package_arn: str, **kwargs: Any) -> TinkerTrainingClient:
        """A new training run with a ``tinker://`` checkpoint's weights (fresh optimizer)."""
        self._check_open()
        sdk_trainer = call(
            lambda: self.sdk.create_training_client_from_state(model_package_arn).result(),
            "create_training_client_from_state",
        )
        return self._track(sdk_trainer, sdk_trainer.get_info().model_data.model_name or "")

    def create_training_client_from_state_with_optimizer(
        self, model_package_arn: str, **kwargs: Any
    ) -> TinkerTrainingClient:
        """A new training run resuming a ``save_state`` checkpoint (weights + optimizer)."""
        self._check_open()
        sdk_trainer = call(
            lambda: self.sdk.create_training_client_from_state_with_optimizer(model_package_arn).result(),
            "create_training_client_from_state_with_optimizer",
        )
        return self._track(sdk_trainer, sdk_trainer.get_info().model_data.model_name or "")

    def create_sampling_client(
        self, *, base_model: Optional[str] = None, model_package_arn: Optional[str] = None
    ) -> TinkerSamplingClient:
        """A sampler on ``base_model`` or on a ``tinker://`` checkpoint."""
        self._check_open()
        if not base_model and not model_package_arn:
            raise InvalidInputError("create_sampling_client: pass base_model or model_package_arn")
        model = self.resolve_base_model(base_model) if base_model else None
        sdk_sampler = call(
            lambda: self.sdk.create_sampling_client(model_path=model_package_arn or None, base_model=model).result(),
            "create_sampling_client",
        )
        name = base_model or sdk_sampler.get_base_model()
        return TinkerSamplingClient(sdk_sampler, lambda: self.get_tokenizer(name))

    def list_sessions(self) -> List[Dict[str, str]]:
        """This client's running training runs."""
        with self._lock:
            return [
                {"training_session_name": c.name, "status": "Running", "base_model": c.base_model}
                for c in self._clients.values()
            ]

    def stop_session(self, training_session: str) -> None:
        with self._lock:
            client = next((c for c in self._clients.values() if c.name == training_session), None)
        if client is None:
            raise InvalidInputError(f"no running training run named {training_session!r} in this client")
        client.stop()

    def close(self, status: str = "success") -> None:
        """Stop every client and finish the Tinker session. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            clients = list(self._clients.values())
        for client in clients:
            client.stop()
        self._finalizer.detach()
        atexit.unregister(self._finalizer)
        _finish(self.sdk, status)

    def __enter__(self) -> "TinkerServiceClient":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close("success" if exc_type is None else "errored" if issubclass(exc_type, Exception) else "interrupted")


def _finish(sdk: Any, status: str) -> None:
    try:
        sdk.close(status).result(timeout=30)
    except Exception as exc:  # noqa: BLE001 - closing must not mask the error that ended the run
        log.warning("could not finish the Tinker session: %s", exc)
