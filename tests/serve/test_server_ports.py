"""Every rlkit server answers a port in use the same way: one line, exit code 2, no traceback."""

import socket
import subprocess
import sys

import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


@pytest.fixture
def taken_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("argv", [["emulate", "sagemaker"], ["serve", "tinker"]])
def test_a_port_in_use_is_one_line_exit_2(argv, taken_port):
    proc = warm_rlkit.run([*argv, "--port", str(taken_port)], timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"rlkit: error: cannot listen on 127.0.0.1:{taken_port}: the address is already in use (another server?); "
        "choose another --port, or --port 0 for a free one"
    ]


def test_serve_help_lists_its_modes_and_check_is_an_alias(capsys):
    from rlkit.cli import main
    from rlkit.serve.cli import EXIT_PARTIAL, exit_code

    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "rlkit serve tinker" in out and "rlkit endpoint check URL" in out and "--access-log" in out
    assert main(["serve", "chek", "http://127.0.0.1:9"]) == 2
    assert "unknown mode 'chek'" in capsys.readouterr().err.splitlines()[0]
    with pytest.raises(SystemExit) as done:
        main(["serve", "check"])  # the checker's own parser: it needs the URL
    assert done.value.code == 2 and "rlkit endpoint check: error: the following arguments are required: url" in capsys.readouterr().err
    report = {"results": [{"status": "pass"}, {"status": "skip"}]}
    assert exit_code(report) == 0
    assert exit_code({"results": [*report["results"], {"status": "partial"}]}) == EXIT_PARTIAL == 3
    assert exit_code({"results": [{"status": "partial"}, {"status": "fail"}]}) == 1


@pytest.mark.parametrize("flags, logged", [([], False), (["--access-log"], True)])
def test_rlkit_serve_logs_requests_on_stdout_only_when_asked(flags, logged):
    import os
    import re
    import signal

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "rlkit", "serve", "--model", "tiny", "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = None
        for line in proc.stderr:
            match = re.search(r"at (http://\S+)/v1", line)
            if match:
                url = match.group(1)
                break
        assert url, "the server did not start"
        assert httpx.get(url + "/v1/models", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    assert ("GET /v1/models" in stdout) is logged, stdout
