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
