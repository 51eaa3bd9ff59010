"""``rlkit endpoint check``: a full pass on ``rlkit serve``, and a non-compliant endpoint flagged."""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlkit.serve.checker import Checker, check_endpoint, normalize_url

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


class SloppyHandler(BaseHTTPRequestHandler):
    """An "OpenAI-compatible" endpoint that gets the shape right and the behaviour wrong: it
    ignores temperature, seed, max_tokens, stop, n, top_p, logprobs and stream, makes usage up,
    and answers bad requests with a FastAPI-style 422 ``{"detail": ...}``."""

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "sloppy", "object": "model"}]})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            body = json.loads(raw)
            assert isinstance(body.get("messages"), list) and body["messages"]
        except Exception:  # noqa: BLE001
            self._send(422, {"detail": "validation error"})
            return
        text = " ".join(random.choice(WORDS) for _ in range(12))
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 5},
            },
        )


@pytest.fixture(scope="module")
def sloppy_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SloppyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def statuses(report):
    return {r["name"]: r["status"] for r in report["results"]}


def test_rlkit_serve_passes_every_probe(tiny_server, api_key):
    from rlkit.backends.local.models import load_tokenizer

    report = check_endpoint(tiny_server.url, api_key=api_key, tokenizer=load_tokenizer("tiny"))
    assert report["model"] == "tiny" and report["url"] == tiny_server.base_url
    assert set(statuses(report)) == set(Checker.PROBES)
    failing = {r["name"]: r["detail"] for r in report["results"] if r["status"] != "pass"}
    # constrained decoding: even the random tiny model's forced tool calls and JSON answers pass
    assert not failing, failing
    usage = next(r for r in report["results"] if r["name"] == "usage")
    assert "counted with the chat template" in usage["detail"]


def test_a_non_compliant_endpoint_is_flagged(sloppy_url):
    report = check_endpoint(sloppy_url)
    got = statuses(report)
    assert got["models"] == "pass" and got["basic"] == "pass"  # the shape is right ...
    for probe in ("temperature_0", "max_tokens", "stop", "n", "seed", "top_p", "logprobs", "stream", "usage", "errors"):
        assert got[probe] == "fail", (probe, report)  # ... the behaviour is not
    assert got["auth"] == "skip"


def test_cli_json_and_table(tiny_server, api_key, sloppy_url, capsys):
    from rlkit.serve.cli import endpoint_command

    rc = endpoint_command(["check", tiny_server.url, "--api-key", api_key, "--json", "--only", "stop,n"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["name"] for r in report["results"]] == ["models", "stop", "n"]
    rc = endpoint_command(["check", sloppy_url + "/v1", "--only", "max_tokens"])
    out = capsys.readouterr().out
    assert rc == 1 and "max_tokens" in out and "fail" in out and "1 fail" in out


def test_unreachable_endpoint_fails_cleanly():
    report = check_endpoint("http://127.0.0.1:9", timeout=5)
    assert [r["name"] for r in report["results"]] == ["models"] and report["results"][0]["status"] == "fail"


def test_normalize_url():
    assert normalize_url("127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalize_url("http://h:1/v1/") == "http://h:1/v1"
    assert normalize_url("https://h/openai/v1") == "https://h/openai/v1"
