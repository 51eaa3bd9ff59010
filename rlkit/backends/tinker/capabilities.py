"""What a Tinker service honours (:class:`rlkit.engine.capabilities.Capabilities`), in one place the clients
and the config check read."""

from rlkit.losses.builtin import builtin_config_keys
from rlkit.engine.capabilities import Capabilities

TINKER_ALPHA = 32  # the service's fixed LoRA scale is alpha 32 / rank (tinker-cookbook's helpers assume it too)


def tinker_capabilities(lora_alpha: int = TINKER_ALPHA) -> Capabilities:
    """What a Tinker service honours: the four built-ins whose maths is rlkit's, rank only (alpha
    fixed by the service), prompt logprobs; rlkit's other losses run linearised."""
    return Capabilities(
        engine="tinker",
        builtin_losses=builtin_config_keys(),
        native_custom_losses=False,
        fixed_lora_alpha=int(lora_alpha),
        scores_any_temperature=False,  # rlkit.backends.tinker.convert.native_data refuses another temperature
        notes=("the trainer scores at temperature 1 only",),
    )
