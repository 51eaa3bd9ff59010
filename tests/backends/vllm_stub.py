"""A tiny in-process stand-in for ``vllm serve``, following vLLM's documented OpenAI-compatible API:
``POST /v1/completions`` (token-id prompts, ``n``, ``logprobs`` with ``return_tokens_as_token_ids``,
``prompt_logprobs``, ``stop_token_ids``, ``ignore_eos``), ``POST /v1/load_lora_adapter`` /
``/v1/unload_lora_adapter`` (400 when already loaded, 404 when unknown), ``GET /health``,
``GET /v1/models``. Its "model" is arithmetic: the next token depends on the context and on which
adapter was asked for, so a test can tell versions apart. Run as a script it is a fake ``vllm``
command (``vllm serve MODEL --port P ...``) for the launch tests."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional

VOCAB = 500


def token_logprob(token: int) -> float:
    return -0.05 - (token % 7) * 0.1


class Stub:
    def __init__(self, base: str = "base", *, delay_s: float = 0.0, vocab: int = VOCAB, port: int = 0):
        self.base = base
        self.delay_s = delay_s
        self.vocab = vocab
        self.adapters: Dict[str, str] = {}  # name -> path
        self.offsets: Dict[str, int] = {base: 0}
        self.requests: List[Dict[str, Any]] = []
        self.events: List[tuple] = []
        self.answer_as: Optional[str] = None  # answer with this model name (a misbehaving server)
        # prompt logprobs of the base model from this function (prompt -> one per token after the first),
        # e.g. the trainer's own, so the stub passes (or fails) rlkit's model check; None: the arithmetic model's
        self.prompt_scorer: Optional[Callable[[List[int]], List[float]]] = None
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                raw = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path == "/health":
                    return self._send(200, "")
                if self.path == "/v1/models":
                    data = [{"id": stub.base, "object": "model", "parent": None}]
                    data += [{"id": n, "object": "model", "parent": stub.base, "root": p} for n, p in stub.adapters.items()]
                    return self._send(200, {"object": "list", "data": data})
                self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                code, answer = stub.handle(self.path, body)
                self._send(code, answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the API --------------------------------------------------------------------------------
    def handle(self, path: str, body: Dict[str, Any]):
        if path == "/v1/load_lora_adapter":
            name, lora_path = body["lora_name"], body["lora_path"]
            with self.lock:
                if name in self.adapters:
                    return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}
                self.adapters[name] = lora_path
                self.offsets[name] = 1 + len(self.offsets) * 37
                self.events.append(("load", name, lora_path))
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if path == "/v1/unload_lora_adapter":
            name = body["lora_name"]
            with self.lock:
                if name not in self.adapters:
                    return 404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}}
                del self.adapters[name]
                self.events.append(("unload", name))
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        if path == "/v1/completions":
            return self.complete(body)
        return 404, {"error": {"message": f"no route {path}"}}

    def complete(self, body: Dict[str, Any]):
        model = body.get("model")
        with self.lock:
            self.requests.append(body)
            known = model == self.base or model in self.adapters
            offset = self.offsets.get(model, 0)
        if not known:
            return 404, {"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}}
        if "seed" in body:  # what vLLM's CPU engine does with one
            return 500, {"error": {"message": "RuntimeError: CPU Generator does not use offset"}}
        if self.delay_s:
            time.sleep(self.delay_s)
        prompt = body["prompt"]
        temperature = float(body.get("temperature") or 1.0)  # --logprobs-mode processed_logprobs: scores / T (greedy: T = 1)
        stops = set(body.get("stop_token_ids") or [])
        choices = []
        for i in range(int(body.get("n", 1))):
            context, out = list(prompt), []
            finish = "length"
            for _ in range(int(body["max_tokens"])):
                token = (sum(context) * 31 + offset + i * 7 + len(context)) % self.vocab
                out.append(token)
                context.append(token)
                if token in stops:
                    finish = "stop"
                    break
            choice: Dict[str, Any] = {
                "index": i, "text": "", "finish_reason": finish,
                "logprobs": {"tokens": [f"token_id:{t}" if body.get("return_tokens_as_token_ids") else str(t) for t in out],
                             "token_logprobs": [token_logprob(t) / temperature for t in out], "top_logprobs": None, "text_offset": []},
            }
            if body.get("prompt_logprobs") is not None:
                scored = self.prompt_scorer(prompt) if self.prompt_scorer and model == self.base else [token_logprob(t) for t in prompt[1:]]
                choice["prompt_logprobs"] = [None] + [
                    {str(t): {"logprob": lp, "rank": 1, "decoded_token": "x"}} for t, lp in zip(prompt[1:], scored)
                ]
            choices.append(choice)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": sum(len(c["logprobs"]["tokens"]) for c in choices)}
        return 200, {"id": "cmpl-stub", "object": "text_completion", "model": self.answer_as or model, "choices": choices, "usage": usage}


def main(argv: List[str]) -> None:
    """``vllm_stub.py serve MODEL --served-model-name NAME --port P ...``: a fake ``vllm`` command."""
    args: Dict[str, str] = {}
    for i, a in enumerate(argv):
        if a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            args[a] = argv[i + 1]
    flags = set(argv)
    if "--crash" in flags:
        print("ValueError: this fake server crashes on start", flush=True)
        sys.exit(3)
    import os

    print("argv", " ".join(argv), flush=True)
    print("env VLLM_ALLOW_RUNTIME_LORA_UPDATING", os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"), flush=True)
    stub = Stub(args.get("--served-model-name", "base"), port=int(args.get("--port", 0)))
    print("serving", stub.url, flush=True)
    stub.thread.join()


if __name__ == "__main__":
    main(sys.argv)
