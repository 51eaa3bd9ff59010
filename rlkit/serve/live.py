"""Token-by-token streaming: content deltas sent while the sampler is still decoding.

A sampling client that accepts an ``on_token`` listener (the local backend's) reports each token
the moment it is chosen; :func:`open_live_stream` turns those reports into
``chat.completion.chunk`` objects, so the first content arrives after the first decode step
instead of after the whole completion (time to first token = prefill + one step).

The text sent so far is always a prefix of the final text (what the non-streamed response holds):

- a token that ends inside a multi-byte character sends nothing until the character completes;
- text that could be the start of a ``stop`` sequence is held back until it no longer can be (the
  stop sequence itself is never sent, as OpenAI specifies);
- when the sampler finishes, the final text comes from :func:`~rlkit.serve.text.finish_choice`,
  exactly as for a non-streamed request, and whatever of it was not sent yet goes out with the
  finish reason.

Requests that ask for ``logprobs`` (which may need a rescoring pass after sampling), and clients
without ``on_token`` (the SageMaker proxy), are streamed from the finished completion instead.

A client that disconnects mid-stream cancels its sample (:meth:`~rlkit.futures.APIFuture.cancel`):
the local sampler drops its rows at the next decode step, so requests sharing or queued behind
that decode do not wait for tokens nobody will read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Dict, List, Sequence

from rlkit.errors import InvalidInputError
from rlkit.serve.capabilities import context_window
from rlkit.serve.protocol import APIError, ChatRequest, bad_request, choice_delta, chunk_body, new_id, usage_body
from rlkit.serve.text import TokenText, finish_choice
from rlkit.types import StopReason

log = logging.getLogger("rlkit.serve")


class LiveText:
    """The sendable text of one choice as its tokens arrive."""

    def __init__(self, tt: TokenText, stops: Sequence[str]):
        self.tt = tt
        self.stops = [s for s in stops if s]
        self.tokens: List[int] = []
        self.sent = ""
        self.closed = False  # a stop sequence was seen: nothing after it is ever sent

    def push(self, token: int) -> str:
        """Add one sampled token; return the new text that is now safe to send (may be empty)."""
        if self.closed or token in self.tt.special:
            return ""
        self.tokens.append(int(token))
        text = self.tt.decode(self.tokens)
        if text.endswith("\ufffd"):  # inside a multi-byte character
            return ""
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            text, self.closed = text[: min(found)], True
        else:
            text = text[: len(text) - self._held_back(text)]
        return self._advance(text)

    def finish(self, final_text: str) -> str:
        """The rest of the final text (normally everything after what was sent)."""
        return self._advance(final_text)

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that a stop sequence starts with."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if s.startswith(text[-k:]):
                    best = k
                    break
        return best

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):  # cannot take back what was sent; should not happen
            log.warning("streamed text diverged from the decoded text; sending no more for this choice")
            self.closed = True
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


async def open_live_stream(service: Any, req: ChatRequest):
    """Start sampling ``req`` with a token listener; return ``(snapshot, chunk iterator)``.

    Everything that can fail as a plain HTTP error (unknown model, a template that refuses the
    messages, a context overflow, invalid sampling parameters) fails here, before the stream starts;
    a failure while decoding is sent as an ``{"error": ...}`` event, as OpenAI does mid-stream.
    """
    snapshot = service.snapshot_for(req.model)
    client = snapshot.client
    tt = service.token_text(client.get_tokenizer())
    prompt = service.render(snapshot, req)
    params = service.sampling_params(req, len(prompt), context_window(client))
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def on_token(index: int, token: int) -> None:  # sampler thread
        loop.call_soon_threadsafe(queue.put_nowait, ("token", index, token))

    try:
        future = client.sample(prompt, num_samples=req.n, sampling_params=params, on_token=on_token)
    except InvalidInputError as exc:
        raise bad_request(str(exc), None) from None

    async def wait_done() -> None:
        try:
            queue.put_nowait(("done", await future, None))
        except Exception as exc:  # noqa: BLE001 - reported to the client as an error event
            queue.put_nowait(("error", exc, None))

    waiter = asyncio.ensure_future(wait_done())
    ident, created, model = new_id(), int(time.time()), service.source.name
    usage_field = {"usage": None} if req.include_usage else {}

    def chunk(choices: List[Dict[str, Any]], **extra: Any) -> Dict[str, Any]:
        body = chunk_body(id=ident, model=model, created=created, fingerprint=snapshot.fingerprint, choices=choices, **extra)
        if "usage" not in extra:
            body.update(usage_field)
        return body

    def delta(index: int, content: str) -> Dict[str, Any]:
        return chunk([choice_delta(index, {"content": content})])

    async def chunks() -> AsyncIterator[Dict[str, Any]]:
        texts = [LiveText(tt, req.stop or []) for _ in range(req.n)]
        try:
            for i in range(req.n):
                yield chunk([choice_delta(i, {"role": "assistant", "content": ""})])
            while True:
                kind, a, b = await queue.get()
                if kind == "token":
                    piece = texts[a].push(b)
                    if piece:
                        yield delta(a, piece)
                    continue
                if kind == "error":
                    err = APIError(500, f"The server had an error while processing your request: {type(a).__name__}: {a}", type="server_error")
                    yield {"error": err.body()["error"]}
                    return
                response = a
                break
            generated = 0
            for i, seq in enumerate(response.sequences):
                choice = finish_choice(tt, seq.tokens, seq.logprobs, seq.stop_reason == StopReason.STOP, req.stop)
                generated += choice.generated
                rest = texts[i].finish(choice.text)
                if rest:
                    yield delta(i, rest)
                yield chunk([choice_delta(i, {}, finish_reason=choice.finish_reason)])
            if req.include_usage:
                usage = response.usage
                yield chunk([], usage=usage_body(usage.prefill_tokens or len(prompt), usage.decode_tokens or generated))
        finally:
            if not future.done():  # the client went away: its rows leave the decode at the next step
                future.cancel()
            if not waiter.done():
                waiter.cancel()

    return snapshot, chunks()
