"""A local emulator of the SageMaker training-session service, backed by rlkit's local engine.

The real ``sagemaker-train`` SDK talks to it unchanged (through botocore), so loops written for
SageMaker can be developed and tested offline, at no cost::

    from rlkit.backends.sagemaker.emulator import Emulator
    with Emulator().start() as emu:
        os.environ.update(emu.env())      # SAGEMAKER_TRAINING_SESSION_[RUNTIME_]ENDPOINT, AWS_REGION
        ...                               # rlkit.connect("sagemaker") or the SDK's ServiceClient

or from a shell: ``rlkit emulate sagemaker --port 8765``. Needs botocore and
uvicorn (``rlkit[sagemaker]``; HTTP: ``rlkit.backends.http_service``).
"""

from rlkit.backends.sagemaker.emulator.server import Emulator
from rlkit.backends.sagemaker.emulator.state import EmulatorOptions

__all__ = ["Emulator", "EmulatorOptions"]
