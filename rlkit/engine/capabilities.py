"""What an engine declares it honours (DESIGN §2b): :class:`Capabilities`, and the LoRA defaults
every engine trains with. The front door (:mod:`rlkit.engine.clients`, :mod:`rlkit.engine.service`)
routes by these and refuses, before any work, what an engine cannot do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple

from rlkit.errors import InvalidInputError
from rlkit.types import AdamParams

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
