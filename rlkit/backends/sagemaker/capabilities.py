"""What SageMaker AI training sessions honour (:class:`rlkit.engine.capabilities.Capabilities`), in one place
the training and sampling clients and the config check all read."""

from rlkit.losses.builtin import builtin_config_keys
from rlkit.engine.capabilities import Capabilities

#: SageMaker training sessions: the four built-ins, any alpha, rank 1..256; other losses linearised
SAGEMAKER_CAPABILITIES = Capabilities(
    engine="sagemaker",
    builtin_losses=builtin_config_keys(),
    native_custom_losses=False,
    max_lora_rank=256,
    lora_layers_settable=False,
    polled_operations=True,  # DescribeOperation polled every ~2 s: keep a step's calls in flight together
    # AdamParamsConfig limits of the runtime model (botocore checks only the lower bounds)
    adam_limits={"learning_rate": (0.0, 0.01), "beta1": (0.0, 0.999999), "beta2": (0.0, 0.999999), "eps": (1e-16, 0.01),
                 "weight_decay": (0.0, 1.0), "grad_clip_norm": (0.0, 100.0), "lora_plus_lr_ratio": (1.0, 100.0)},
    notes=("the trainer's per-token logprobs come back only when asked; rlkit scores them through a saved weight version",),
)
