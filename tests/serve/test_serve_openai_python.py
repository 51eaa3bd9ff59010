"""The official ``openai`` Python client against ``rlkit serve`` on the tiny model."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.chat import prompt_tokens

MESSAGES = [{"role": "user", "content": "Say something."}]


def test_plain_completion_shape_and_usage(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert r.system_fingerprint.startswith("rlkit-")
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    # usage counted against our own rendering of the chat template
    expected_prompt = len(prompt_tokens(load_tokenizer("tiny"), MESSAGES))
    assert r.usage.prompt_tokens == expected_prompt
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_greedy_is_deterministic_and_matches_the_sampler(client, tiny_source):
    from rlkit.types import SamplingParams

    texts = {client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0).choices[0].message.content for _ in range(2)}
    assert len(texts) == 1
    sampler = tiny_source.current().client
    tokens = prompt_tokens(sampler.get_tokenizer(), MESSAGES)
    seq = sampler.sample(tokens, 1, SamplingParams(max_tokens=10, temperature=0)).result().sequences[0]
    assert texts.pop() == sampler.get_tokenizer().decode(seq.tokens, skip_special_tokens=True)


def test_max_completion_tokens_and_default(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=3, temperature=1, seed=0)
    assert r.usage.completion_tokens <= 3
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0)  # server default: 32
    assert r.usage.completion_tokens <= 32


def test_stream_equals_non_streamed(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=20, temperature=0)
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_n_choices_and_seed(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=1.0, n=3, seed=11)
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    c = client.chat.completions.create(**{**kwargs, "seed": 12})
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    texts = [ch.message.content for ch in a.choices]
    assert texts == [ch.message.content for ch in b.choices]
    assert texts != [ch.message.content for ch in c.choices]
    assert len(set(texts)) > 1
    assert a.usage.completion_tokens <= 3 * 8
    if all(ch.finish_reason == "length" for ch in a.choices):
        assert a.usage.completion_tokens == 3 * 8


def test_stop_sequence_is_honoured_and_excluded(client):
    base = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=1, seed=5).choices[0].message.content
    k = next(i for i in range(len(base) // 2, len(base)) if not base[i].isspace() and base.find(base[i]) > 0)
    stop = base[k]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=1, seed=5, stop=[stop, "never-there"])
    assert r.choices[0].message.content == base[: base.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    # streamed: same cut
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=1, seed=5, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == base[: base.find(stop)]


def test_logprobs_and_top_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens - (1 if r.choices[0].finish_reason == "stop" else 0)
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-4)  # greedy = top-1
        assert bytes(e.bytes).decode("utf-8", errors="replace") == e.token
    # at temperature 0.5 logprobs are still the model's raw ones: same tokens, same values as a rescoring
    r2 = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0.5, seed=1, logprobs=True)
    assert all(e.logprob <= 0 and e.top_logprobs == [] for e in r2.choices[0].logprobs.content)
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None


def test_auth_required_and_refused(tiny_server):
    for key in (None, "sk-wrong-key-0000"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(tiny_server.base_url + "/chat/completions", json={"model": "tiny", "messages": MESSAGES}, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["message"]
    with openai.OpenAI(base_url=tiny_server.base_url, api_key="sk-wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as info:
            bad.models.list()
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
    assert httpx.get(tiny_server.url + "/health").json()["status"] == "ok"  # health needs no key


def test_models_route(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nothing")


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"model": "tiny"}, "messages", "missing_required_parameter"),
        ({"model": "tiny", "messages": []}, "messages", "empty_array"),
        ({"model": "tiny", "messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"model": "tiny", "messages": MESSAGES, "temperature": "hot"}, "temperature", "invalid_type"),
        ({"model": "tiny", "messages": MESSAGES, "temperature": 3}, "temperature", "invalid_value"),
        ({"model": "tiny", "messages": MESSAGES, "max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"model": "tiny", "messages": MESSAGES, "max_tokens": 100000}, "max_tokens", "integer_above_max_value"),
        ({"model": "tiny", "messages": MESSAGES, "n": 99}, "n", "integer_above_max_value"),
        ({"model": "tiny", "messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
        ({"model": "tiny", "messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "invalid_value"),
        ({"model": "tiny", "messages": MESSAGES, "frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter"),
        ({"model": "tiny", "messages": MESSAGES, "tools": [{"type": "function"}]}, "tools[0].function.name", "missing_required_parameter"),
        ({"model": "tiny", "messages": MESSAGES, "temprature": 0.5}, "temprature", "unknown_parameter"),
        ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]", "invalid_value"),
    ],
)
def test_malformed_requests_get_openai_400s(client, body, param, code):
    extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=body["model"], messages=body.get("messages", openai.NOT_GIVEN), extra_body=extra or None)
    err = info.value.body
    assert info.value.status_code == 400
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and err["code"] == code and err["message"]


def test_neutral_values_of_unsupported_parameters_are_accepted(client):
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, frequency_penalty=0, presence_penalty=0.0, user="u1", response_format={"type": "text"}
    )
    assert r.choices[0].message.content is not None


def test_invalid_json_unknown_model_unknown_route(tiny_server, api_key):
    auth = {"Authorization": f"Bearer {api_key}", "content-type": "application/json"}
    r = httpx.post(tiny_server.base_url + "/chat/completions", content=b"{nope", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(tiny_server.base_url + "/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(tiny_server.base_url + "/completions", json={}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = httpx.get(tiny_server.base_url + "/chat/completions", headers=auth)
    assert r.status_code == 405 and "error" in r.json()


def test_oversized_requests(client, tiny_server, api_key):
    huge = [{"role": "user", "content": "x" * (70 * 1024)}]  # over the 64 KiB body limit
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="tiny", messages=huge, max_tokens=1)
    assert info.value.status_code == 413 and info.value.body["code"] == "request_too_large"
    # a chunked upload (no Content-Length) is cut off too
    auth = {"Authorization": f"Bearer {api_key}", "content-type": "application/json"}
    payload = json.dumps({"model": "tiny", "messages": huge}).encode()
    r = httpx.post(tiny_server.base_url + "/chat/completions", content=iter([payload[i : i + 8192] for i in range(0, len(payload), 8192)]), headers=auth)
    assert r.status_code == 413
    # a prompt longer than the model's context window (tiny: 2048 positions), within the body limit
    long = [{"role": "user", "content": " ".join(["hello"] * 2100)}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=long, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"
    # prompt + max_tokens over the context window
    mid = [{"role": "user", "content": " ".join(["hello"] * 1900)}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=mid, max_tokens=256)
    assert info.value.body["code"] == "context_length_exceeded"


def test_concurrent_requests_share_a_decode(client, tiny_source):
    """Concurrent HTTP requests reach the sampler together: fewer decodes than requests."""
    sampler = tiny_source.current().client._runtime.sampler.sampler
    sizes = []
    original = sampler.sample

    def recording(requests, **kwargs):  # requests that join a running decode add no call
        sizes.append(len(requests))
        return original(requests, **kwargs)

    sampler.sample = recording
    barrier = threading.Barrier(8)
    results = [None] * 8

    def call(i):
        barrier.wait()
        results[i] = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48, temperature=1, seed=i)

    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        del sampler.sample
    assert all(r is not None for r in results)
    assert len(sizes) < 8, sizes
    # batching does not change a seeded result
    again = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48, temperature=1, seed=3)
    assert again.choices[0].message.content == results[3].choices[0].message.content
