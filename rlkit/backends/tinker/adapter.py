"""rlkit's session API over the official ``tinker`` SDK (0.38.0).

``rlkit.connect("tinker", api_key=..., base_url=...)`` returns a :class:`TinkerServiceClient`;
loops written against :mod:`rlkit.engine` run on it unchanged, on Thinking Machines' service or
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
import weakref
from typing import Any, Dict, Optional

from rlkit.backends.tinker.clients import TinkerSamplingClient, TinkerTrainingClient, call
from rlkit.errors import BackendUnavailableError, InvalidInputError
from rlkit.backends.tinker.capabilities import TINKER_ALPHA, tinker_capabilities
from rlkit.engine.checks import LoraRequest
from rlkit.engine.service import ServiceClientBase

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
        ServiceClientBase.__init__(self)
        self._status = "success"
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

    def _wrap(self, sdk_trainer: Any, base_model: str) -> TinkerTrainingClient:
        info = sdk_trainer.get_info()
        client = TinkerTrainingClient(self, sdk_trainer, base_model, int(info.lora_rank or 0))
        self._track(client)
        return client

    def _create_lora(self, request: LoraRequest) -> TinkerTrainingClient:
        """A new LoRA training run (checked by :meth:`rlkit.engine.service.ServiceClientBase.create_lora_training_client`).
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
        return self._wrap(sdk_trainer, base_model)

    def _from_state(self, checkpoint: str, with_optimizer: bool, kwargs: Dict[str, Any]) -> TinkerTrainingClient:
        """A new training run from a ``tinker://`` checkpoint (Tinker creates it from the path:
        the checkpoint fixes base model, rank and layers). The keywords are checked as everywhere
        (:meth:`rlkit.engine.service.ServiceClientBase._from_state_request`); a LoRA shape the service
        cannot honour, or a ``rank=`` other than the checkpoint's, is refused in one line."""
        where = "create_training_client_from_state_with_optimizer" if with_optimizer else "create_training_client_from_state"
        alpha = kwargs.get("alpha")
        self.capabilities.check_lora(kwargs.get("rank") or 1, self.capabilities.fixed_lora_alpha if alpha is None else alpha, where,
                                     train_attn=kwargs.get("train_attn"), train_mlp=kwargs.get("train_mlp"),
                                     train_unembed=kwargs.get("train_unembed"))
        create = self.sdk.create_training_client_from_state_with_optimizer if with_optimizer else self.sdk.create_training_client_from_state
        sdk_trainer = call(lambda: create(checkpoint).result(), where)
        client = self._wrap(sdk_trainer, kwargs.get("base_model") or sdk_trainer.get_info().model_data.model_name or "")
        if kwargs.get("rank") is not None and kwargs["rank"] != client.rank:
            client.stop()
            raise InvalidInputError(f"{where}: rank={kwargs['rank']} cannot be honoured: checkpoint {checkpoint!r} is rank {client.rank}")
        return client

    def _create_sampling_client(self, base_model: Optional[str], checkpoint: Optional[str]) -> TinkerSamplingClient:
        """A sampler on ``base_model`` or on a ``tinker://`` checkpoint (exactly one is given:
        :meth:`rlkit.engine.service.ServiceClientBase.create_sampling_client`)."""
        model = self.resolve_base_model(base_model) if base_model else None
        sdk_sampler = call(
            lambda: self.sdk.create_sampling_client(model_path=checkpoint, base_model=model).result(),
            "create_sampling_client",
        )
        name = base_model or sdk_sampler.get_base_model()
        return TinkerSamplingClient(sdk_sampler, lambda: self.get_tokenizer(name))

    def close(self, status: str = "success") -> None:
        """Stop every client and finish the Tinker session (``status``: how it ended). Idempotent."""
        self._status = status
        super().close()

    def _close(self, first: bool) -> list:
        if first:
            self._finalizer.detach()
            atexit.unregister(self._finalizer)
            _finish(self.sdk, self._status)
        return []

    def __enter__(self) -> "TinkerServiceClient":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close("success" if exc_type is None else "errored" if issubclass(exc_type, Exception) else "interrupted")


def _finish(sdk: Any, status: str) -> None:
    try:
        sdk.close(status).result(timeout=30)
    except Exception as exc:  # noqa: BLE001 - closing must not mask the error that ended the run
        log.warning("could not finish the Tinker session: %s", exc)
