"""Fixtures shared by the loss tests."""

import pytest

from helpers import sft_datum
from rlkit.types import AdamParams

SEQS = [[1, 40, 41, 42, 43, 2], [1, 50, 51, 52, 2], [1, 60, 61, 62, 63, 64, 65, 2]]


@pytest.fixture()
def warm_trainer(service):
    """A tiny-model trainer after one step, so B != 0 and every LoRA matrix has gradient."""
    t = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    t.forward_backward([sft_datum(s, prompt_len=2) for s in SEQS])
    t.optim_step(AdamParams(learning_rate=1e-2)).result()
    yield t
    t.stop()
