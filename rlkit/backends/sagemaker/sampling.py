"""The SageMaker sampling client, and the glue every adapter client shares (futures, errors).

``sample(max_tokens=n)`` with ``n`` below the service's floor of 512 asks the service for 512 and
keeps the first ``n`` tokens of each sequence (see :mod:`.convert`).
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from rlkit.backends.sagemaker import convert
from rlkit.errors import InvalidInputError, OperationError
from rlkit.futures import APIFuture
from rlkit.types import SampleResponse, TokenUsage

from rlkit.backends.sagemaker.errors import (  # noqa: F401 (re-exported: the adapter's error classes)
    RESUME,
    TERMINAL,
    OperationTimeoutError,
    QuotaExceededError,
    SessionBlockedError,
    SessionEndedError,
    _aws_error,
    translate,
)
from rlkit.backends.sagemaker.capabilities import SAGEMAKER_CAPABILITIES
from rlkit.backends.sagemaker.service import SessionService
from rlkit.engine.capabilities import Capabilities
from rlkit.engine.clients import SamplingClientBase

log = logging.getLogger("rlkit.sagemaker")

class SageMakerSamplingClient(SamplingClientBase):
    """Samples from one set of weights of a SageMaker session (a checkpoint, or the base model);
    the contract's checks are :class:`rlkit.engine.clients.SamplingClientBase`'s."""

    max_samples = 1000  # the service's range of num_samples

    def __init__(self, service: SessionService, sdk: Any, *, base_model: str, owns_session: bool, owner: Any = None,
                 session: str = ""):
        """``sdk``: the SDK's sampling client, or an :class:`~rlkit.futures.APIFuture` of it (the
        weights are still being saved and loaded for sampling: the first request waits for them,
        and fails with their error; ``session`` then names the training session)."""
        self._service = service
        self._pending: Optional[APIFuture] = sdk if isinstance(sdk, APIFuture) else None
        self._ready = None if self._pending is not None else sdk
        self._owner = owner  # the SDK client whose session this sampler owns (ServiceClient.create_sampling_client)
        self.base_model = base_model
        self.training_session_name = self.name = session or sdk.training_session_name
        self._owns_session = owns_session
        self._stopped = False

    @property
    def _sdk(self) -> Any:
        """The SDK's sampling client (waited for, once, while its weights are being published)."""
        if self._ready is None:
            self._ready = self._pending.result(timeout=self._service.operation_timeout_s)
        return self._ready

    @property
    def model_package_arn(self) -> str:
        return getattr(self._sdk, "model_package_arn", "")

    @property
    def capabilities(self) -> Capabilities:
        return SAGEMAKER_CAPABILITIES

    def get_tokenizer(self) -> Any:
        return self._service.get_tokenizer(self.base_model)

    def _sample(self, tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs) -> APIFuture[SampleResponse]:
        if params.temperature is not None and params.temperature > 2:
            raise InvalidInputError(f"sample: temperature={params.temperature} exceeds the service's maximum of 2")
        wire = {"max_tokens": convert.service_max_tokens(params.max_tokens, self._service.min_max_tokens)}
        for key in ("temperature", "top_p", "top_k", "seed", "stop"):
            value = getattr(params, key)
            if value is not None:
                wire[key] = value
        requested = params.max_tokens

        def call() -> Any:
            return self._sdk.sample(
                convert.tokens_to_wire(tokens), num_samples=num_samples, sampling_params=wire,
                include_prompt_logprobs=include_prompt_logprobs, topk_prompt_logprobs=topk_prompt_logprobs,
            )

        def parse(out: Any) -> SampleResponse:
            if any(s.tokens and s.logprobs is None for s in out.sequences):
                raise OperationError(
                    "sample: the service returned sampled tokens without their logprobs; rlkit's RL losses need the "
                    "sampler's logprobs (the importance ratio), so it refuses to go on without them"
                )
            sequences, billed = convert.truncate_sequences(out.sequences, requested)
            return SampleResponse(
                sequences=sequences,
                prompt_logprobs=convert.prompt_logprobs_to_rlkit(out.prompt_logprobs, len(tokens)) if include_prompt_logprobs else None,
                topk_prompt_logprobs=convert.topk_to_rlkit(out.topk_prompt_logprobs, len(tokens)),
                usage=TokenUsage(prefill_tokens=len(tokens), decode_tokens=billed),
            )

        return self._service.submit(call, parse, "sample", self.training_session_name)

    def _compute_logprobs(self, tokens) -> APIFuture[List[Optional[float]]]:
        return self._service.submit(
            lambda: self._sdk.compute_logprobs(convert.tokens_to_wire(tokens)),
            lambda out: [None if v is None else float(v) for v in out],
            "compute_logprobs",
            self.training_session_name,
        )

    def stop(self) -> None:
        """Retire this client; a sampler the service client created for itself also stops its session."""
        if self._stopped:
            return
        self._stopped = True
        if self._ready is None:  # still publishing: retire the SDK client once it exists
            self._pending.add_done_callback(lambda f: f.exception() is None and f.result().stop())
            return
        if self._owns_session:
            self._sdk.stop()  # retire the SDK sampler, then stop the session it rode on
            self._service._stop_sdk(self._owner or self._sdk, self.training_session_name)
        else:
            self._sdk.stop()  # a sampler sharing a training client's session only retires

