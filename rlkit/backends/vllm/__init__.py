"""``backend.sampler=vllm``: training in the local engine, sampling on vLLM servers.

``rlkit.connect("local", sampler="vllm", vllm={"urls": [...]})`` (or ``{"launch": True}``) gives a
:class:`VllmServiceClient`: the local backend's service whose sampling clients talk to vLLM's
OpenAI-compatible servers, each weight version a LoRA adapter loaded by name. See docs/scale.md.
"""

from rlkit.backends.vllm.options import VllmOptions
from rlkit.backends.vllm.pool import ServerPool
from rlkit.backends.vllm.sampling import VllmSamplingClient
from rlkit.backends.vllm.service import VllmServiceClient, VllmTrainingClient, vllm_capabilities

__all__ = ["ServerPool", "VllmOptions", "VllmSamplingClient", "VllmServiceClient", "VllmTrainingClient", "vllm_capabilities"]
