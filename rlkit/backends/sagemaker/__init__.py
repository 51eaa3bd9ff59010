"""The SageMaker backend: rlkit's session API over the official ``sagemaker-train`` SDK.

``rlkit.connect("sagemaker", region=..., role_arn=..., model_package_group_arn=...,
s3_output_path=..., kms_key_arn=..., vpc_config=...)``; see :mod:`.adapter` for what differs from
the local backend and ``docs/sagemaker.md`` for running on SageMaker and on the local emulator
(:mod:`.emulator`). The SDK is an optional extra (``pip install 'rlkit[sagemaker]'``); importing
this package does not import it.
"""

from __future__ import annotations

from typing import Any


def connect(**options: Any):
    """``rlkit.connect("sagemaker", ...)``: a :class:`~.adapter.SageMakerServiceClient`."""
    from rlkit.backends.sagemaker.adapter import SageMakerServiceClient

    return SageMakerServiceClient(**options)


__all__ = ["connect"]
