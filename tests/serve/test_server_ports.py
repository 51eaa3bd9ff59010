"""Every rlkit server answers a port in use the same way: one line, exit code 2, no traceback."""

import socket
import subprocess
import sys

import pytest


@pytest.fixture
def taken_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("argv", [["emulate", "sagemaker"], ["serve", "tinker"]])
def test_a_port_in_use_is_one_line_exit_2(argv, taken_port):
    proc = subprocess.run([sys.executable, "-m", "rlkit", *argv, "--port", str(taken_port)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"rlkit: error: cannot listen on 127.0.0.1:{taken_port}: the address is already in use (another server?); "
        "choose another --port, or --port 0 for a free one"
    ]
