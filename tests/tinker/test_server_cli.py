"""``rlkit serve tinker`` as a user starts it: a subprocess the SDK reaches, stopped by SIGTERM;
bad flags are one line and exit code 2."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

tinker = pytest.importorskip("tinker")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["serve", "tinker", "--host", "0.0.0.0"], "beyond loopback needs an API key"),
        (["emulate", "tinker", "--api-key", "nope"], "start with 'tml-'"),
        (["serve", "tinker", "--model", "oops"], "expected NAME=LOCAL"),
        (["serve", "tinker", "--error-rate", "2"], "between 0 and 1"),
    ],
)
def test_bad_flags_are_one_line_exit_2(argv, message):
    proc = warm_rlkit.run(argv, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def test_serve_tinker_subprocess_trains_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlkit", "serve", "tinker", "--port", "0", "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the server did not print its URL"
        service = tinker.ServiceClient(base_url=url, api_key="tml-local")
        trainer = service.create_lora_training_client(base_model="tiny", rank=2).result()
        datum = tinker.types.Datum(
            model_input=tinker.types.ModelInput.from_ints([1, 2, 3, 4]),
            loss_fn_inputs={"target_tokens": [2, 3, 4, 5], "weights": [1.0] * 4},
        )
        assert trainer.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"] > 0
        path = trainer.save_state("kept").result().path
        service.close("success").result()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "server stopped" in out
        assert path in (tmp_path / "tinker_checkpoints.json").read_text()  # the index outlives the server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
