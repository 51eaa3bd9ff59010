"""What SageMaker AI training sessions honour (:class:`rlkit.session.Capabilities`), in one place
the training and sampling clients and the config check all read."""

from rlkit.losses.builtin import builtin_config_keys
from rlkit.session import Capabilities

#: SageMaker training sessions: the four built-ins, any alpha, rank 1..256; other losses linearised
SAGEMAKER_CAPABILITIES = Capabilities(
    engine="sagemaker",
    builtin_losses=builtin_config_keys(),
    native_custom_losses=False,
    max_lora_rank=256,
    lora_layers_settable=False,
    notes=("the trainer's per-token logprobs come back only when asked; rlkit scores them through a saved weight version",),
)
