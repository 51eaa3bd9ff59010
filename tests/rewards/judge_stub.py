"""A tiny local OpenAI-compatible stub (FastAPI + uvicorn) whose answers a test scripts: a queue of
status codes, a delay, a reply text; it counts requests and the most in flight at once."""


import asyncio
import threading
from typing import Any, Dict, List


class Stub:
    def __init__(self):
        self.statuses: List[int] = []  # popped per request; empty = 200
        self.delay_s = 0.0
        self.reply = "Score: 7"
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: List[Dict[str, Any]] = []
        self._lock = threading.Lock()

    def app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> Any:
            body = await request.json()
            with self._lock:
                self.requests += 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                self.bodies.append(body)
                status = self.statuses.pop(0) if self.statuses else 200
            try:
                await asyncio.sleep(self.delay_s)
                if status != 200:
                    error = {"error": {"message": f"stub {status}", "type": "server_error", "param": None, "code": None}}
                    return JSONResponse(error, status_code=status)
                return {
                    "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": self.reply}}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
                }
            finally:
                with self._lock:
                    self.in_flight -= 1

        return app
