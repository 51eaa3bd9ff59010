"""The services' shared HTTP stack (rlkit.backends.http_service, uvicorn underneath), on a trivial
service: open connections cost no thread, every kind of idle socket is timed out, blocking
handlers (long-polls) do not starve each other, a port in use fails at bind, and a client that
vanishes mid-request leaves no traceback. The Tinker server's and the emulator's hostile-client
tests cover framing and size limits through the real services."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest

pytest.importorskip("uvicorn")
from rlkit.backends.http_service import LocalHTTPService  # noqa: E402
from rlkit.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


class Echo(LocalHTTPService):
    thread_name = "test-echo-http"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.blocked = 0
        self.lock = threading.Lock()

    def handle(self, method, raw_path, headers, body):
        if raw_path.startswith("/block"):  # a long-poll: holds its handler until released
            with self.lock:
                self.blocked += 1
            self.release.wait(10)
        return 200, {"Content-Type": "application/json"}, json.dumps({"path": raw_path, "bytes": len(body)}).encode()


@pytest.fixture
def echo():
    server = Echo().start()
    yield server
    server.release.set()
    server.stop()


def get(server, path="/ping", timeout=5.0):
    with urllib.request.urlopen(server.url + path, timeout=timeout) as resp:
        return json.loads(resp.read())


def test_idle_sockets_hold_no_thread_and_a_request_still_answers_at_once(echo):
    assert get(echo)["path"] == "/ping"  # warm: the handler thread exists
    before = threading.active_count()
    idle = [socket.create_connection(echo.address, timeout=5) for _ in range(50)]
    try:
        time.sleep(0.2)
        assert threading.active_count() - before < 5  # http.server held one thread per socket: +50
        t0 = time.monotonic()
        assert get(echo)["path"] == "/ping"
        assert time.monotonic() - t0 < 1.0
    finally:
        for s in idle:
            s.close()


def test_silent_trickling_and_stalled_sockets_are_timed_out(echo):
    echo.idle_timeout_s = 0.3
    with socket.create_connection(echo.address, timeout=5) as silent:  # sends nothing at all
        t0 = time.monotonic()
        assert silent.recv(10) == b""
        assert time.monotonic() - t0 < 3
    with socket.create_connection(echo.address, timeout=5) as slow:  # a head, one byte every 0.1 s
        t0 = time.monotonic()
        with pytest.raises(OSError):
            for byte in b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100:
                slow.sendall(bytes([byte]))
                time.sleep(0.1)
        assert time.monotonic() - t0 < 3  # one deadline for the whole head, not one per byte
    with socket.create_connection(echo.address, timeout=5) as stalled:  # a body that stops coming
        stalled.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        answer = stalled.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer.lower()
    assert get(echo)["path"] == "/ping"


def test_blocking_handlers_do_not_starve_others(echo):
    # 60 long-polls at once (over anyio's default of 40 threads) and a quick request still answers
    pollers = [threading.Thread(target=get, args=(echo, f"/block/{i}", 20.0), daemon=True) for i in range(60)]
    for t in pollers:
        t.start()
    deadline = time.monotonic() + 8
    while echo.blocked < 60 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert echo.blocked == 60
    t0 = time.monotonic()
    assert get(echo)["path"] == "/ping" and time.monotonic() - t0 < 1.0
    echo.release.set()
    for t in pollers:
        t.join(10)


def test_bind_takes_the_port_now_and_a_vanished_client_is_quiet(echo, capfd):
    taken = Echo().bind("127.0.0.1", 0)
    try:
        assert taken.url == f"http://127.0.0.1:{taken.address[1]}"  # url right after bind, before start
        with pytest.raises(ConfigError, match="already in use"):
            Echo().bind("127.0.0.1", taken.address[1])
    finally:
        taken.stop()
    for _ in range(3):  # gone while its handler runs, and gone mid-body
        with socket.create_connection(echo.address, timeout=5) as s:
            s.sendall(b"GET /block/gone HTTP/1.1\r\nHost: x\r\n\r\n")
        with socket.create_connection(echo.address, timeout=5) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    time.sleep(0.3)
    echo.release.set()
    assert get(echo)["path"] == "/ping"
    assert "Traceback" not in capfd.readouterr().err


# -- the process's budget of request-body bytes -------------------------------------------------------


def post(url, path, body, headers=None, timeout=60.0):
    """(status, headers, parsed body) of a POST, errors included."""
    import urllib.error

    req = urllib.request.Request(url + path, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, json.loads(err.read() or b"null")


def test_bodies_over_the_budget_wait_then_get_503_and_the_budget_is_given_back(echo, monkeypatch):
    from rlkit.backends import http_body

    budget = http_body.BodyBudget(1 << 20, wait_s=0.3)
    monkeypatch.setattr(http_body, "BODY_BUDGET", budget)
    status, headers, answer = post(echo.url, "/big", b"x" * (2 << 20))  # under the 256 MiB body limit, over the budget
    assert status == 503 and headers.get("retry-after") == "1" and "RLKIT_BODY_BUDGET_BYTES" in answer["message"]
    assert post(echo.url, "/small", b"x" * 1000)[2] == {"path": "/small", "bytes": 1000}
    assert budget.held == 0 and 0 < budget.peak <= budget.total


def _zstd_bomb(size: int) -> bytes:
    zstandard = pytest.importorskip("zstandard")
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = bytes(1 << 20)
    return b"".join([compressor.compress(zeros) for _ in range(size >> 20)] + [compressor.flush()])


def _vm_hwm(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def test_compression_bombs_at_once_hold_about_the_budget_and_the_server_still_answers(tmp_path):
    """Six zstd bombs (16 KB each, 512 MiB decompressed, over the 256 MiB body limit) sent at once to
    `rlkit emulate sagemaker --max-request-bytes 256MiB` with a 64 MiB body budget: its peak memory grows by about the budget, not
    6 x 256 MiB as each decompressing to the limit would; each bomb is refused (503 or 413) and a
    compressed ordinary request answers afterwards."""
    import os
    import signal
    import subprocess
    import sys

    import zstandard

    budget = 64 << 20
    bomb = _zstd_bomb(512 << 20)
    env = dict(os.environ, RLKIT_BODY_BUDGET_BYTES=str(budget), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "rlkit", "emulate", "sagemaker", "--port", "0", "--num-threads", "1",
                             "--state-dir", str(tmp_path), "--cadence", "fast", "--max-request-bytes", str(256 << 20)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        first = proc.stdout.readline()
        assert "listening on http://" in first, first
        url = first.strip().rsplit(" ", 1)[-1]
        with urllib.request.urlopen(url + "/_emulator/health", timeout=30) as resp:
            assert json.loads(resp.read())["ok"]
        before = _vm_hwm(proc.pid)
        statuses = []

        def send():
            statuses.append(post(url, "/_emulator/config", bomb, {"Content-Encoding": "zstd"}, timeout=120)[0])

        threads = [threading.Thread(target=send) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
        grown = _vm_hwm(proc.pid) - before
        assert sorted(statuses) and set(statuses) <= {413, 503} and len(statuses) == 6, statuses
        assert grown < budget + (96 << 20), f"peak memory grew by {grown >> 20} MiB under a {budget >> 20} MiB budget"
        ordinary = zstandard.ZstdCompressor().compress(json.dumps({"latency_ms": 0}).encode())
        status, _, answer = post(url, "/_emulator/config", ordinary, {"Content-Encoding": "zstd"})
        assert status == 200 and answer["latency_ms"] == 0, answer
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
