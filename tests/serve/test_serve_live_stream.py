"""Token-by-token streaming (rlkit.serve.live): text held back at stop-sequence prefixes, deltas that
are always a prefix of the final text, and content that leaves before the sampler has finished."""

from __future__ import annotations

import json
import threading

import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.serve.live import LiveText
from rlkit.serve.text import TokenText, finish_choice
from rlkit.types import SampledSequence, SampleResponse, StopReason, TokenUsage


@pytest.fixture(scope="module")
def tt():
    return TokenText(load_tokenizer("tiny"))


def stream(tt, text, stops):
    ids = tt.tokenizer.encode(text, add_special_tokens=False)
    live = LiveText(tt, stops)
    deltas = [live.push(t) for t in ids]
    final = finish_choice(tt, ids, None, False, stops).text
    deltas.append(live.finish(final))
    return deltas, final


def test_deltas_spell_the_final_text(tt):
    deltas, final = stream(tt, "héllo wörld — 世界 ok\n\tend", [])
    assert "".join(deltas) == final == tt.decode(tt.tokenizer.encode("héllo wörld — 世界 ok\n\tend", add_special_tokens=False))
    assert sum(1 for d in deltas[:-1] if d) > 3  # sent as it went, not all at the end
    assert all("\ufffd" not in d for d in deltas)


def test_stop_sequence_is_never_sent_and_its_prefix_is_held_back(tt):
    deltas, final = stream(tt, "one two three END four", ["END"])
    assert final == "one two three " and "".join(deltas) == final
    assert not any("E" in d for d in deltas)
    # a prefix of the stop sequence that turns out not to be one is sent once it is clear
    deltas, final = stream(tt, "say ENTER now", ["END"])
    assert "".join(deltas) == final == "say ENTER now"


def test_end_of_turn_token_sends_nothing(tt):
    live = LiveText(tt, [])
    eos = next(iter(tt.special))
    assert live.push(eos) == "" and live.tokens == []


class HeldClient:
    """A sampling client that reports one token, then waits for the test to see it before finishing.

    If the server waited for the whole completion before streaming, the test's event would never be
    set and ``sample`` would fail after its timeout.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.first_delta_seen = threading.Event()

    def get_tokenizer(self):
        return self.tokenizer

    def tokens(self):
        return self.tokenizer.encode("Hi", add_special_tokens=False)[0], self.tokenizer.encode(" you", add_special_tokens=False)[-1]

    def sample(self, prompt, num_samples=1, sampling_params=None, *, on_token=None):
        from concurrent.futures import Future

        from rlkit.futures import APIFuture

        first, second = self.tokens()
        fut: Future = Future()

        def run():
            on_token(0, first)
            if not self.first_delta_seen.wait(timeout=30):
                fut.set_exception(RuntimeError("the first token was not streamed before the completion finished"))
                return
            on_token(0, second)
            seq = SampledSequence(stop_reason=StopReason.LENGTH, tokens=[first, second], logprobs=[-0.1, -0.2])
            fut.set_result(SampleResponse(sequences=[seq], usage=TokenUsage(prefill_tokens=len(prompt), decode_tokens=2)))

        threading.Thread(target=run, daemon=True).start()
        return APIFuture(fut, operation="sample")


def test_first_content_leaves_before_the_sampler_finishes(tt):
    import httpx

    from rlkit.serve import FixedModel, create_app, start_server

    client = HeldClient(tt.tokenizer)
    server = start_server(create_app(FixedModel(client, name="held", base_model="tiny")))
    try:
        body = {"model": "held", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
        contents, usage = [], None
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                for c in chunk["choices"]:
                    if c["delta"].get("content"):
                        contents.append(c["delta"]["content"])
                        client.first_delta_seen.set()
                usage = chunk.get("usage") or usage
        assert "".join(contents) == tt.decode(list(client.tokens())) and len(contents[0]) > 0
        assert len(contents) == 2 and usage["completion_tokens"] == 2
    finally:
        server.stop()
