"""Shared fixtures. Everything runs on the CPU with no network; the tiny model unless a test is
about the real one."""

from __future__ import annotations

import os
import signal
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
warnings.filterwarnings("ignore", category=FutureWarning)

# A shell starts a background job (`pytest ... &`) with SIGINT ignored, and children inherit that:
# the tests that press Ctrl-C on an `rlkit` subprocess would then test nothing (the run ignores it
# and finishes, exit 0). Give this process, and so every child, Python's default handling back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def checkpoint_root(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A local service on the tiny model, closed after the module."""
    import rlkit

    svc = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path_factory.mktemp("ckpt"))  # numerics tests compare at 1e-4
    yield svc
    svc.close()


@pytest.fixture()
def trainer(service):
    client = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    yield client
    client.stop()
