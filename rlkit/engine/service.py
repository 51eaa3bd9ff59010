"""The service-client base every engine inherits: creating training and sampling clients (the
SDK's signatures and defaults, every check once), the registry of the sessions a client runs,
``list_sessions`` / ``stop_session`` / ``close`` (DESIGN §2b; ``docs/adding-an-engine.md``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from rlkit.engine.capabilities import DEFAULT_LORA_ALPHA, DEFAULT_LORA_RANK, Capabilities
from rlkit.engine.checks import FROM_STATE_KEYWORDS, LoraRequest, check_session_options, check_text
from rlkit.errors import InvalidInputError


class ServiceClientBase:
    """The front door every engine's service client inherits: LoRA creation (the SDK's signature
    and defaults, rlkit's alpha, see :data:`DEFAULT_LORA_ALPHA`; the session options every backend
    accepts; the engine's :class:`Capabilities` LoRA checks), creation from a checkpoint (the same
    keywords everywhere, :data:`FROM_STATE_KEYWORDS`), sampling clients (exactly one of a base
    model or a checkpoint, the SDK's rule), the registry of the sessions it runs,
    ``list_sessions`` / ``stop_session`` / ``close`` — once.

    A backend calls ``ServiceClientBase.__init__(self)`` and implements ``_create_lora(request: LoraRequest)``,
    ``_create_sampling_client(base_model, checkpoint)``, and either
    ``_checkpoint_shape(checkpoint)`` (``{"base_model", "rank", "alpha", "train_attn",
    "train_mlp"}``, ``None`` where unknown: the default from-state path then creates a LoRA client
    of that shape and loads the checkpoint into it) or its own ``_from_state``. It registers each
    client it hands out with :meth:`_track` (clients :meth:`_forget` themselves when stopped) and
    may add teardown in ``_close(errors)`` and ``_stop_untracked(name)`` (a session it does not hold).
    """

    def __init__(self) -> None:
        import threading

        self._clients: Dict[int, Any] = {}
        self._registry_lock = threading.RLock()
        self._closed = False

    @property
    def capabilities(self) -> Capabilities:
        raise NotImplementedError

    def _check_open(self) -> None:
        """Refuse new sessions once closed (a backend may add its own preconditions)."""
        if self._closed:
            from rlkit.errors import ClientStoppedError

            raise ClientStoppedError("this service client was closed")

    def create_lora_training_client(
        self,
        base_model: str,
        *,
        rank: int = DEFAULT_LORA_RANK,
        alpha: int = DEFAULT_LORA_ALPHA,
        training_session_name: Optional[str] = None,
        seed: Optional[int] = None,
        train_mlp: Optional[bool] = None,
        train_attn: Optional[bool] = None,
        train_unembed: Optional[bool] = None,
        **session_options: Any,
    ) -> Any:
        """A new LoRA training client on ``base_model``. SageMaker's session options
        (``model_package_group_arn``, ``s3_output_path``, ``kms_key_arn``, ``vpc_config``,
        ``user_metadata``) are accepted everywhere (other engines ignore them) so one call runs on
        every backend; anything else, or a LoRA shape the engine cannot honour, is refused in one line."""
        self._check_open()
        check_session_options(session_options)
        self.capabilities.check_lora(rank, alpha, train_attn=train_attn, train_mlp=train_mlp, train_unembed=train_unembed)
        return self._create_lora(LoraRequest(base_model, rank, alpha, seed, train_attn, train_mlp, train_unembed,
                                             training_session_name, dict(session_options)))

    def _create_lora(self, request: LoraRequest) -> Any:
        raise NotImplementedError

    def create_full_training_client(self, base_model: str, *, training_session_name: Optional[str] = None,
                                    seed: Optional[int] = None, **session_options: Any) -> Any:
        """A new full-parameter training client on ``base_model``: every weight trains, no adapter
        (a :class:`LoraRequest` of rank 0, as its checkpoints record). Refused in one line where
        the engine's :attr:`Capabilities.full_finetune` is false."""
        self._check_open()
        check_session_options(session_options, "create_full_training_client")
        if not self.capabilities.full_finetune:
            raise InvalidInputError(f"create_full_training_client: the {self.capabilities.engine} engine trains LoRA adapters "
                                    "only; use create_lora_training_client (model.lora=true), or backend=local for full fine-tuning")
        return self._create_lora(LoraRequest(base_model, 0, 0, seed, None, None, None, training_session_name, dict(session_options)))

    # -- from a checkpoint --------------------------------------------------------------------------
    def create_training_client_from_state(self, model_package_arn: str, **kwargs: Any) -> Any:
        """A new session holding a checkpoint's weights (the optimizer starts fresh)."""
        return self._from_state(self._from_state_request(model_package_arn, kwargs, "create_training_client_from_state"), False, kwargs)

    def create_training_client_from_state_with_optimizer(self, model_package_arn: str, **kwargs: Any) -> Any:
        """A new session resuming a ``save_state`` checkpoint (weights and optimizer)."""
        where = "create_training_client_from_state_with_optimizer"
        return self._from_state(self._from_state_request(model_package_arn, kwargs, where), True, kwargs)

    def _from_state_request(self, checkpoint: Any, kwargs: Mapping[str, Any], where: str) -> str:
        self._check_open()
        check_text(checkpoint, "model_package_arn", where)
        if not checkpoint:
            from rlkit.errors import CheckpointNotFoundError

            raise CheckpointNotFoundError(f"{where}: no checkpoint '' (pass the id save_state returned)")
        unknown = sorted(set(kwargs) - FROM_STATE_KEYWORDS)
        if unknown:
            raise InvalidInputError(f"{where}: unknown keyword(s) {unknown} (it takes {sorted(FROM_STATE_KEYWORDS)})")
        return checkpoint

    def _from_state(self, checkpoint: str, with_optimizer: bool, kwargs: Dict[str, Any]) -> Any:
        """The checkpoint's shape (keywords override it), a new LoRA client of that shape, the
        checkpoint loaded into it; the client is stopped if the load fails."""
        shape = self._checkpoint_shape(checkpoint)
        kwargs = dict(kwargs)
        base_model = kwargs.pop("base_model", None) or shape["base_model"]
        for key in ("rank", "alpha", "train_attn", "train_mlp"):
            if kwargs.get(key) is None and shape.get(key) is not None:
                kwargs[key] = shape[key]
        if kwargs.get("rank") is None or kwargs.get("alpha") is None:
            raise InvalidInputError(
                f"checkpoint {checkpoint!r} does not record its LoRA shape (it was not saved by rlkit); pass rank=... and alpha=..."
            )
        if kwargs["rank"] == 0:  # a full fine-tuning checkpoint (every weight, no adapter)
            lora_keys = ("rank", "alpha", "train_attn", "train_mlp", "train_unembed")
            client = self.create_full_training_client(base_model, **{k: v for k, v in kwargs.items() if k not in lora_keys})
        else:
            client = self.create_lora_training_client(base_model, **kwargs)
        try:
            (client.load_state_with_optimizer if with_optimizer else client.load_state)(checkpoint).result()
        except BaseException:
            client.stop()
            raise
        return client

    def _checkpoint_shape(self, checkpoint: str) -> Dict[str, Any]:
        raise NotImplementedError

    # -- sampling clients ------------------------------------------------------------------------------
    def create_sampling_client(self, *, base_model: Optional[str] = None, model_package_arn: Optional[str] = None) -> Any:
        """A sampler on ``base_model`` or on the checkpoint ``model_package_arn``: exactly one of
        the two (the SageMaker SDK's rule; ``""`` counts as not given), on every engine; no engine
        picks a model of its own."""
        where = "create_sampling_client"
        self._check_open()
        check_text(base_model, "base_model", where, optional=True)
        check_text(model_package_arn, "model_package_arn", where, optional=True)
        if bool(base_model) == bool(model_package_arn):
            raise InvalidInputError(f"{where}: pass exactly one of base_model= or model_package_arn=")
        return self._create_sampling_client(base_model or None, model_package_arn or None)

    def _create_sampling_client(self, base_model: Optional[str], checkpoint: Optional[str]) -> Any:
        """The engine's sampling client on ``base_model`` or on ``checkpoint`` (exactly one is a
        non-empty string, the other ``None``)."""
        raise NotImplementedError

    # -- the sessions this client runs ---------------------------------------------------------------
    def _track(self, client: Any) -> None:
        """Hold ``client`` (it has ``name``, ``base_model``, ``stop()``) until it forgets itself;
        a client made after :meth:`close` is stopped and refused."""
        with self._registry_lock:
            closed = self._closed
            if not closed:
                self._clients[id(client)] = client
        if closed:
            from rlkit.errors import ClientStoppedError

            client.stop()
            raise ClientStoppedError("this service client was closed")

    def _forget(self, client: Any) -> None:
        with self._registry_lock:
            self._clients.pop(id(client), None)

    def _running(self) -> List[Any]:
        with self._registry_lock:
            return list(self._clients.values())

    def list_sessions(self) -> List[Dict[str, Any]]:
        """The sessions this client runs."""
        return [{"training_session_name": c.name, "status": "Running", "base_model": c.base_model} for c in self._running()]

    def stop_session(self, training_session: str) -> None:
        """Stop a session by name (or ARN: its last part)."""
        name = str(training_session).rsplit("/", 1)[-1]
        client = next((c for c in self._running() if c.name == name), None)
        if client is None:
            self._stop_untracked(name)
        else:
            client.stop()

    def _stop_untracked(self, name: str) -> None:
        raise InvalidInputError(f"no running {self.capabilities.engine} session named {name!r} in this client")

    def close(self) -> None:
        """Stop every session this client started, then the engine's own teardown. Idempotent; a
        failing stop does not keep the others running (the first failure is raised afterwards,
        unless another exception is already on its way out)."""
        import sys

        with self._registry_lock:
            first, self._closed = not self._closed, True
        errors: List[BaseException] = []
        if first:
            for client in self._running():
                try:
                    client.stop()
                except Exception as exc:  # noqa: BLE001 - stop the others, then report
                    errors.append(exc)
        errors += self._close(first)
        if errors and sys.exc_info()[1] is None:
            raise errors[0]

    def _close(self, first: bool) -> List[BaseException]:
        """The engine's teardown after the sessions stopped (``first``: the first ``close()``);
        returns the failures to report."""
        return []
