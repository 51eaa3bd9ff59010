"""A server that is safe to expose: no unauthenticated non-loopback bind unless asked for, no empty
keys, one line for a port in use, OpenAI-shaped 400s for hostile bodies, and a client that goes
away mid-stream stops its decode."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from rlkit.cli import main
from rlkit.serve import FixedModel, create_app, start_server
from rlkit.serve.cli import is_loopback

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

MESSAGES = [{"role": "user", "content": "Greet me."}]


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--host", "0.0.0.0"], {}, "--host '0.0.0.0' is reachable beyond this machine and no API key is set"),
        (["--host", "::"], {}, "no API key is set: pass --api-key KEY (or set RLKIT_API_KEY), or --insecure-no-auth"),
        (["--api-key", ""], {}, "--api-key is empty"),
        (["--host", "0.0.0.0", "--api-key", "  "], {}, "--api-key is empty"),
        ([], {"RLKIT_API_KEY": ""}, "$RLKIT_API_KEY is empty"),
    ],
)
def test_unsafe_auth_settings_are_refused_in_one_line(capsys, monkeypatch, argv, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["serve", "--model", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlkit: error: ") and message in err, err


def wait_for_url(proc, seen):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            return None
        seen.append(line)
        match = re.search(r"at (http://\S+)/v1", line)
        if match:
            return match.group(1)
    return None


def test_insecure_no_auth_serves_beyond_loopback_and_a_port_in_use_is_one_line(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RLKIT_API_KEY", None)
    serve = [sys.executable, "-m", "rlkit", "serve", "--model", "tiny", "--log-level", "warning"]
    proc = subprocess.Popen(
        [*serve, "--host", "0.0.0.0", "--port", "0", "--insecure-no-auth"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        seen = []
        url = wait_for_url(proc, seen)
        assert url, "".join(seen)
        assert "auth: OFF (--insecure-no-auth)" in seen[-1]
        port = int(url.rsplit(":", 1)[1])
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2},
        )
        assert r.status_code == 200, r.text
        second = subprocess.run(
            [*serve, "--port", str(port)], capture_output=True, text=True, env=env, timeout=120, check=False
        )
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"rlkit: error: cannot listen on 127.0.0.1:{port}: the address is already in use (another server?); "
            "choose another --port, or --port 0 for a free one"
        ]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def default_server(tiny_source):
    """The tiny model with the CLI's default limits (1 MiB bodies)."""
    with start_server(create_app(tiny_source)) as server:
        yield server


def post(server, content: bytes):
    return httpx.post(
        server.base_url + "/chat/completions", content=content, timeout=30, headers={"content-type": "application/json"}
    )


@pytest.mark.parametrize(
    "body, code",
    [
        (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
        (b'{"model": "tiny", "messages": ' + b"[" * 60_000 + b"]" * 60_000 + b"}", "invalid_json"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": ' + b"[" * 900 + b"]" * 900 + b"}]}", None),
        (b'{"model": "tiny", "messages": [1, 2, 3]}', None),
        (b"\xff\xfe not json", "invalid_json"),
        (b"[]", "invalid_json"),
    ],
)
def test_hostile_bodies_get_an_openai_shaped_400(default_server, body, code):
    r = post(default_server, body)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    if code:
        assert error["code"] == code
    healthy = post(default_server, json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 2}).encode())
    assert healthy.status_code == 200


def test_bodies_over_the_process_body_budget_get_an_openai_shaped_503_and_the_server_still_answers(default_server, monkeypatch):
    """rlkit serve takes the bytes it reads from the same process-wide budget as the Tinker and
    SageMaker servers (rlkit/backends/http_body.py): a body that does not fit within the wait is a
    503 with Retry-After, and the budget is given back for the next request."""
    from rlkit.backends import http_body

    budget = http_body.BodyBudget(4096, wait_s=0.2)
    monkeypatch.setattr(http_body, "BODY_BUDGET", budget)
    big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 8000}], "max_tokens": 2}).encode()
    r = post(default_server, big)
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text[:300]
    error = r.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "server_busy" and "RLKIT_BODY_BUDGET_BYTES" in error["message"]
    healthy = post(default_server, json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 2}).encode())
    assert healthy.status_code == 200 and budget.held == 0


class RecordingClient:
    """A sampling client that keeps the futures it returns and counts the tokens it decoded."""

    def __init__(self, inner):
        self.inner = inner
        self.futures = []
        self.tokens = 0

    def get_tokenizer(self):
        return self.inner.get_tokenizer()

    @property
    def context_window(self):
        return self.inner.context_window

    def sample(
        self,
        prompt,
        num_samples=1,
        sampling_params=None,
        *,
        include_prompt_logprobs=False,
        topk_prompt_logprobs=None,
        on_token=None,
    ):
        def counting(index, token):
            self.tokens += 1
            if on_token is not None:
                on_token(index, token)

        future = self.inner.sample(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs=include_prompt_logprobs,
            topk_prompt_logprobs=topk_prompt_logprobs,
            on_token=counting,
        )
        self.futures.append(future)
        return future


def test_a_client_disconnecting_mid_stream_cancels_its_decode(serve_service):
    client = RecordingClient(serve_service.create_sampling_client(base_model="tiny"))
    source = FixedModel(client, name="tiny", base_model="tiny")
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
    }  # greedy: 1500 tokens
    with start_server(create_app(source)) as server:
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            events = 0
            for line in r.iter_lines():
                events += line.startswith("data: ")
                if events >= 4:
                    break  # leave mid-stream: closing the response drops the connection
        future = client.futures[-1]
        deadline = time.monotonic() + 60
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert future.done()
        with pytest.raises(concurrent.futures.CancelledError):
            future.result()
        assert client.tokens < 1500  # stopped at the next decode step after the disconnect
        after = httpx.post(
            server.base_url + "/chat/completions", json={**body, "stream": False, "max_tokens": 3}, timeout=60
        )
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] <= 3
