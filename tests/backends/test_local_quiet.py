"""The Python API is as quiet as the CLI: loading and wrapping a model prints no library
FutureWarning (transformers' ``is_gradient_checkpointing``), and the user's warning filters are
left as they were.

peft up to 0.21 read ``model.is_gradient_checkpointing`` while wrapping a model (transformers 5's
deprecated alias: a FutureWarning raised inside transformers); peft 0.22 no longer does. The script
reads it itself inside the wrap, as those peft versions did, so the test holds whichever peft is
installed: the warning is raised by transformers' own code during rlkit's loading, every time."""

import subprocess
import sys
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

SCRIPT = """
import warnings
import peft
import rlkit

_wrap = peft.get_peft_model
def get_peft_model(model, *args, **kwargs):  # what peft <= 0.21 did while wrapping
    model.is_gradient_checkpointing
    return _wrap(model, *args, **kwargs)
peft.get_peft_model = get_peft_model

before = [f for f in warnings.filters if f[2] is FutureWarning]  # the user's own (python -W)
with rlkit.connect("local") as service:
    service.create_lora_training_client("tiny", rank=4)
assert [f for f in warnings.filters if f[2] is FutureWarning] == before, "the user's warning filters changed"
print("ok")
"""


def test_a_plain_script_sees_no_library_future_warning():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "FutureWarning" not in out.stderr and "Loading weights" not in out.stderr, out.stderr


def test_python_w_keeps_the_users_choice():
    out = subprocess.run([sys.executable, "-W", "always::FutureWarning", "-c", SCRIPT], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "is_gradient_checkpointing" in out.stderr  # asked for: shown
