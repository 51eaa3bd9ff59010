"""What every backend's clients check and coerce, written once (DESIGN §2b): the
:class:`Capabilities` an engine declares, the LoRA defaults, the keywords every backend accepts,
the checks of prompts, sampling requests and training batches, and :class:`SamplingClientBase`.
:mod:`rlkit.session` re-exports them; its training and service bases call them. Nothing here
imports a backend or a loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from rlkit.errors import InvalidInputError
from rlkit.futures import APIFuture
from rlkit.types import AdamParams, Datum, ModelInput, SampleResponse, SamplingParams

#: LoRA defaults every engine honours. The SageMaker SDK's own default alpha is 64, but Tinker's
#: service fixes the LoRA scale at alpha 32 / rank and takes no alpha; a loop must give the same
#: numbers on every engine, so rlkit's default is the one value all of them can train with (it is
#: always sent explicitly to SageMaker).
DEFAULT_LORA_RANK = 32
DEFAULT_LORA_ALPHA = 32


@dataclass(frozen=True)
class Capabilities:
    """What an engine honours, declared by its backend (DESIGN §2b): the front door routes by it
    and refuses, before any work, what the engine cannot do — never a silent difference.

    ``builtin_losses`` maps each built-in the engine computes itself to the ``loss_fn_config`` keys
    it accepts; ``native_custom_losses`` says the engine runs any :class:`~rlkit.losses.Loss`
    object in one pass (else such losses run linearised); ``fixed_lora_alpha`` is the one alpha the
    engine trains with (``None``: any alpha is honoured); ``max_lora_rank`` bounds the rank;
    ``adam_limits`` maps an :class:`~rlkit.types.AdamParams` field to the ``[low, high]`` range
    the service accepts (checked by ``optim_step`` before anything is sent).
    ``scores_any_temperature=False``: the trainer scores at temperature 1 only (Tinker), so a run
    that would ask for another is refused before it starts (:func:`rlkit.composition.check_scoring_temperature`).
    ``polled_operations``: every call is a remote operation whose result arrives on the service's
    polling cadence (SageMaker: seconds), so a call costs about one poll however small it is and
    loops keep at least a batch of calls in flight (:meth:`in_flight`).
    """

    engine: str
    builtin_losses: Mapping[str, Tuple[str, ...]]
    native_custom_losses: bool = False
    prompt_logprobs: bool = True
    topk_prompt_logprobs: bool = True
    fixed_lora_alpha: Optional[int] = None
    max_lora_rank: Optional[int] = None
    lora_layers_settable: bool = True  # train_attn / train_mlp / train_unembed honoured
    per_request_seed: bool = True
    constrained_decoding: bool = False
    full_finetune: bool = False  # create_full_training_client: every parameter trains (no adapter)
    scores_any_temperature: bool = True  # a datum may ask the trainer to score at its sampling temperature
    polled_operations: bool = False  # each call is a remote operation polled at the service's cadence (see in_flight)
    adam_limits: Mapping[str, Tuple[float, float]] = field(default_factory=dict)
    notes: Tuple[str, ...] = field(default=())

    def in_flight(self, requested: int, batch: int) -> int:
        """How many calls a loop keeps in flight at once: ``requested`` (e.g. ``train.concurrency``),
        raised to ``batch`` (the calls one step makes, e.g. its groups) on an engine with
        ``polled_operations`` — there, calls waiting one after another each pay a whole poll
        (docs/sagemaker.md, "What a step costs"); the numbers do not change, only when each call is sent."""
        requested = max(1, int(requested))
        return max(requested, int(batch)) if self.polled_operations else requested

    def supports_builtin(self, name: Any, config: Optional[Mapping[str, Any]] = None) -> bool:
        """Whether the built-in ``name`` with ``config``'s keys runs natively on this engine."""
        key = getattr(name, "value", name)
        return key in self.builtin_losses and set(config or {}) <= set(self.builtin_losses[key])

    def check_lora(self, rank: Any, alpha: Any, where: str = "create_lora_training_client", *,
                   train_attn: Optional[bool] = None, train_mlp: Optional[bool] = None,
                   train_unembed: Optional[bool] = None) -> None:
        """Refuse, in one line, a LoRA shape this engine cannot honour (layer choices other than
        the default — attention and MLP, no unembedding — where the engine picks the layers)."""
        if not self.lora_layers_settable and (train_attn is False or train_mlp is False or train_unembed):
            raise InvalidInputError(
                f"{where}: train_attn={train_attn}, train_mlp={train_mlp}, train_unembed={train_unembed} cannot be "
                f"honoured on {self.engine}: the service selects the LoRA layers (attention and MLP); leave them unset"
            )
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise InvalidInputError(f"{where}: rank={rank!r} must be a positive integer")
        if self.max_lora_rank is not None and rank > self.max_lora_rank:
            raise InvalidInputError(f"{where}: rank={rank} is above {self.engine}'s limit {self.max_lora_rank}")
        if not isinstance(alpha, int) or isinstance(alpha, bool) or alpha < 1:
            raise InvalidInputError(f"{where}: alpha={alpha!r} must be a positive integer")
        if self.fixed_lora_alpha is not None and alpha != self.fixed_lora_alpha:
            raise InvalidInputError(
                f"{where}: alpha={alpha} cannot be honoured on {self.engine}: its LoRA scale is fixed at alpha "
                f"{self.fixed_lora_alpha} / rank; pass alpha={self.fixed_lora_alpha} (rlkit's default) so every engine "
                "trains the same model"
            )

    def check_adam(self, params: AdamParams, where: str = "optim_step") -> None:
        """Refuse, in one line, an ``AdamParams`` value outside the engine's declared range."""
        for key, (lo, hi) in self.adam_limits.items():
            value = getattr(params, key)
            if value is not None and not lo <= value <= hi:
                raise InvalidInputError(f"{where}: AdamParams.{key}={value} is outside the {self.engine} service's range [{lo:g}, {hi:g}]")

    def rows(self) -> List[Tuple[str, str]]:
        """``(capability, value)`` pairs for a capability matrix."""
        out = [("engine", self.engine)]
        for name in sorted(self.builtin_losses):
            keys = ", ".join(self.builtin_losses[name]) or "-"
            out.append((f"built-in {name}", f"native (config: {keys})"))
        out.append(("custom Loss objects", "native, one pass" if self.native_custom_losses else "linearised (forward + backward)"))
        out.append(("prompt logprobs", "yes" if self.prompt_logprobs else "no"))
        out.append(("top-k prompt logprobs", "yes" if self.topk_prompt_logprobs else "no"))
        out.append(("LoRA alpha", "settable" if self.fixed_lora_alpha is None else f"fixed at {self.fixed_lora_alpha}"))
        out.append(("LoRA rank", f"1..{self.max_lora_rank}" if self.max_lora_rank else ">= 1"))
        out.append(("LoRA layers (attn/mlp/unembed)", "settable" if self.lora_layers_settable else "chosen by the service"))
        out.append(("per-request seed", "yes" if self.per_request_seed else "no"))
        out.append(("constrained decoding", "yes" if self.constrained_decoding else "no"))
        return out


# -- the front door: what every backend's clients check and coerce, written once ----------------------

#: keywords ``create_lora_training_client`` accepts on every backend (SageMaker's session options;
#: the other engines accept and ignore them so the same call runs everywhere)
SESSION_OPTIONS = frozenset({"model_package_group_arn", "s3_output_path", "kms_key_arn", "vpc_config", "user_metadata"})


def check_session_options(options: Mapping[str, Any], where: str = "create_lora_training_client") -> None:
    """Refuse a keyword no backend knows (a typo such as ``rnak=4``), naming it."""
    unknown = sorted(set(options) - SESSION_OPTIONS)
    if unknown:
        raise InvalidInputError(f"{where}: unknown keyword(s) {unknown}")


def prompt_tokens(
    prompt: Any, tokenizer: Callable[[], Any], where: str, *, vocab_size: Optional[int] = None,
    max_positions: Optional[int] = None,
) -> List[int]:
    """The token ids of a ``ModelInput``, a list of ids or a text prompt (encoded with
    ``tokenizer()``, called only for text, without special tokens), refused in one line when
    empty, negative, outside ``vocab_size`` or as long as ``max_positions``."""
    if isinstance(prompt, ModelInput):
        tokens = prompt.to_ints()
    elif isinstance(prompt, str):
        tokens = list(tokenizer().encode(prompt, add_special_tokens=False))
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens = [int(t) for t in prompt]
    else:
        raise InvalidInputError(f"{where}: prompt must be a ModelInput, a list of token ids or text, got {type(prompt).__name__}")
    if not tokens:
        raise InvalidInputError(f"{where}: prompt is empty")
    limit = vocab_size if vocab_size is not None else float("inf")
    bad = [t for t in tokens if t < 0 or t >= limit]
    if bad:
        bound = f"[0, {vocab_size})" if vocab_size is not None else "(token ids are >= 0)"
        raise InvalidInputError(f"{where}: token id {bad[0]} is outside the vocabulary {bound}")
    if max_positions is not None and len(tokens) >= max_positions:
        raise InvalidInputError(f"{where}: prompt has {len(tokens)} tokens; the model's context window is {max_positions}")
    return tokens


def check_sample_request(
    num_samples: Any, sampling_params: Any, topk_prompt_logprobs: Any, *, max_samples: Optional[int] = None,
    where: str = "sample", capabilities: Optional[Capabilities] = None,
) -> SamplingParams:
    """``sample()``'s arguments checked (``max_samples``: the engine's cap) and its
    ``sampling_params`` coerced into :class:`SamplingParams` (unknown fields refused); a
    ``constraint`` is refused in one line when ``capabilities`` say the engine has no constrained decoding."""
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise InvalidInputError(f"{where}: num_samples={num_samples!r} must be a positive integer")
    if max_samples is not None and num_samples > max_samples:
        raise InvalidInputError(f"{where}: num_samples={num_samples} must be an integer in [1, {max_samples}] (the service's range)")
    if topk_prompt_logprobs is not None and (not isinstance(topk_prompt_logprobs, int) or topk_prompt_logprobs < 1):
        raise InvalidInputError(f"{where}: topk_prompt_logprobs={topk_prompt_logprobs!r} must be an integer >= 1")
    params = SamplingParams.coerce(sampling_params, f"{where}: sampling_params")
    if params.constraint is not None and capabilities is not None and not capabilities.constrained_decoding:
        raise InvalidInputError(
            f"{where}: sampling_params.constraint cannot be honoured on {capabilities.engine}: it has no constrained "
            "decoding (sample on backend=local, or drop the constraint)"
        )
    return params


def coerce_batch(batch: Any, loss_fn_inputs: Optional[Mapping[str, Any]], where: str) -> List[Datum]:
    """A training call's batch as :class:`Datum` objects: dicts are parsed (errors name the item),
    a datum without inputs takes the call's ``loss_fn_inputs``; anything else is refused."""
    if not isinstance(batch, (list, tuple)):
        raise InvalidInputError(f"{where}: batch must be a list of Datum, got {type(batch).__name__}")
    data: List[Datum] = []
    for i, item in enumerate(batch):
        if isinstance(item, dict):
            try:
                item = Datum(**item)
            except InvalidInputError as exc:
                raise InvalidInputError(f"{where}: batch[{i}]: {exc}") from None
        if not isinstance(item, Datum):
            raise InvalidInputError(f"{where}: batch[{i}] is a {type(item).__name__}, not a Datum")
        if not item.loss_fn_inputs and loss_fn_inputs:
            item = Datum(model_input=item.model_input, loss_fn_inputs=dict(loss_fn_inputs))
        data.append(item)
    return data


@dataclass(frozen=True)
class LoraRequest:
    """A ``create_lora_training_client`` call after the front door checked it (layer choices
    ``None`` = the engine's default: attention and MLP, no unembedding)."""

    base_model: str
    rank: int
    alpha: int
    seed: Optional[int] = None
    train_attn: Optional[bool] = None
    train_mlp: Optional[bool] = None
    train_unembed: Optional[bool] = None
    name: Optional[str] = None
    options: Mapping[str, Any] = field(default_factory=dict)


#: keywords ``create_training_client_from_state*`` accept on every backend: the LoRA shape and
#: base model (default: what the checkpoint records), ``create_lora_training_client``'s others
FROM_STATE_KEYWORDS = frozenset({"base_model", "rank", "alpha", "seed", "train_attn", "train_mlp", "train_unembed",
                                 "training_session_name"}) | SESSION_OPTIONS

#: the error every backend gives a ``loss_fn_config`` sent with a :class:`~rlkit.losses.Loss` object
LOSS_OBJECT_CONFIG = "loss_fn_config applies to built-in names only; configure the Loss object"


def check_text(value: Any, what: str, where: str, *, optional: bool = False) -> None:
    """Refuse, in one line, a value that must be a string (``optional``: or ``None``)."""
    if (value is None and optional) or isinstance(value, str):
        return
    raise InvalidInputError(f"{where}: {what}={value!r} must be a string")


class EngineClientBase:
    """What a training and a sampling client of an engine both declare: its :class:`Capabilities`,
    the model's vocabulary and context bounds where known, its tokenizer, and the stopped check."""

    _stopped: bool = False
    _stopped_message = "this client was stopped; create a new one"

    @property
    def capabilities(self) -> Capabilities:
        raise NotImplementedError

    @property
    def vocab_size(self) -> Optional[int]:
        return None

    @property
    def max_positions(self) -> Optional[int]:
        return None

    def get_tokenizer(self) -> Any:
        raise NotImplementedError

    def _check(self) -> None:
        if self._stopped:
            from rlkit.errors import ClientStoppedError

            raise ClientStoppedError(self._stopped_message)


class SamplingClientBase(EngineClientBase):
    """The front door every engine's sampling client inherits: ``sample`` / ``compute_logprobs``
    checked and coerced here once (:func:`prompt_tokens`, :func:`check_sample_request`), the
    stopped state, the context manager. A backend supplies the primitives
    ``_sample(tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs, **extensions)``
    and ``_compute_logprobs(tokens)`` and declares :attr:`capabilities`; ``vocab_size`` /
    ``max_positions`` bound the prompt where the engine knows them, ``max_samples`` caps
    ``num_samples`` where the service does, and ``extensions`` names the engine's own keywords
    (the local engine's ``on_token``, ``stop_token_ids``): any other keyword is refused in one line."""

    extensions: frozenset = frozenset()
    max_samples: Optional[int] = None
    _stopped: bool = False
    _stopped_message = "this sampling client was stopped; create a new one"

    def sample(
        self,
        prompt: ModelInput | Sequence[int] | str,
        num_samples: int = 1,
        sampling_params: Optional[SamplingParams | Dict[str, Any]] = None,
        *,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: Optional[int] = None,
        **extensions: Any,
    ) -> APIFuture[SampleResponse]:
        """``num_samples`` completions of ``prompt`` (a ``ModelInput``, token ids or text), prefilled once."""
        self._check()
        unknown = sorted(set(extensions) - set(self.extensions))
        if unknown:
            raise InvalidInputError(f"sample: unexpected keyword(s) {unknown} ({self.capabilities.engine}'s sample takes "
                                    f"{sorted(self.extensions) or 'none beyond the contract'})")
        tokens = prompt_tokens(prompt, self.get_tokenizer, "sample", vocab_size=self.vocab_size, max_positions=self.max_positions)
        params = check_sample_request(num_samples, sampling_params, topk_prompt_logprobs, max_samples=self.max_samples,
                                      capabilities=self.capabilities)
        return self._sample(tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs, **extensions)

    def compute_logprobs(self, prompt: ModelInput | Sequence[int] | str) -> APIFuture[List[Optional[float]]]:
        """One logprob per prompt token (the first is ``None``)."""
        self._check()
        window = None if self.max_positions is None else self.max_positions + 1
        return self._compute_logprobs(prompt_tokens(prompt, self.get_tokenizer, "compute_logprobs", vocab_size=self.vocab_size,
                                                    max_positions=window))

    def _sample(self, tokens: List[int], num_samples: int, params: SamplingParams, include_prompt_logprobs: bool,
                topk_prompt_logprobs: Optional[int], **extensions: Any) -> APIFuture[SampleResponse]:
        raise NotImplementedError

    def _compute_logprobs(self, tokens: List[int]) -> APIFuture[List[Optional[float]]]:
        raise NotImplementedError

    def stop(self) -> None:
        self._stopped = True

    def __enter__(self) -> "SamplingClientBase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
