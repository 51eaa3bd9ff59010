"""The request checks and coercions every engine's clients share, written once: the keywords
every backend accepts, prompts, sampling requests, training batches, string arguments, and the
checked ``create_lora_training_client`` call (:class:`LoraRequest`). Each refusal is one line
naming the call, the argument and the value (:class:`~rlkit.errors.InvalidInputError`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional

from rlkit.engine.capabilities import Capabilities
from rlkit.errors import InvalidInputError
from rlkit.types import Datum, ModelInput, SamplingParams

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
