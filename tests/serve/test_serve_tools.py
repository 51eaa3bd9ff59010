"""Tools over the OpenAI endpoint, driven by the official ``openai`` client.

End to end on the served tiny model (real sampler, real template): ``tools``, ``tool_choice``
(forcing a call by prefilling it and constraining the rest, tests/serve/test_serve_constrained.py),
assistant ``tool_calls`` and ``tool`` messages are accepted and rendered exactly as
:class:`rlkit.tools.ToolRenderer` renders them, streaming and not.

The random tiny model never writes a well-formed call unforced, so the response side — ``tool_calls``,
``finish_reason: "tool_calls"``, an agent loop's second turn — is also tested against a scripted
sampling client (a unit-test fake on the same server code path; it records the prompts it gets).
"""

from __future__ import annotations

import json

import openai
import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.futures import APIFuture
from rlkit.serve.checker import TOOL_PROMPT, WEATHER_TOOL, check_endpoint
from rlkit.tools.render import ToolRenderer, format_call
from rlkit.types import SampledSequence, SampleResponse, StopReason, TokenUsage

KEY = "sk-tools"
ANSWER = "It is sunny in Oslo."


def history(call_id="call_1"):
    return TOOL_PROMPT + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"},
    ]


def serve(source):
    from rlkit.serve import create_app, start_server

    return start_server(create_app(source, api_key=KEY))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def real(serve_service):
    from rlkit.serve import FixedModel

    server = serve(FixedModel(serve_service.create_sampling_client(base_model="tiny"), name="tiny", base_model="tiny"))
    with openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60) as client:
        yield server, client
    server.stop()


def test_tiny_model_end_to_end(real, tok):
    server, client = real
    renderer = ToolRenderer(tok, [WEATHER_TOOL])
    r = client.chat.completions.create(
        model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], max_tokens=8, temperature=0
    )
    assert r.usage.prompt_tokens == len(renderer.prompt(TOOL_PROMPT))  # the schemas are in the prompt
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    # an agent's second turn: the assistant's tool_calls and the tool's result, rendered as rlkit renders them
    normalized = [
        dict(
            m, tool_calls=[{**c, "function": {**c["function"], "arguments": {"city": "Oslo"}}} for c in m["tool_calls"]]
        )
        if m.get("tool_calls")
        else m
        for m in history()
    ]
    r2 = client.chat.completions.create(
        model="tiny", messages=history(), tools=[WEATHER_TOOL], max_tokens=4, temperature=0
    )
    assert r2.usage.prompt_tokens == len(renderer.prompt(normalized))
    # a forced call is a prefilled one: the prompt ends with the call's opening
    forced = client.chat.completions.create(
        model="tiny",
        messages=TOOL_PROMPT,
        tools=[WEATHER_TOOL],
        max_tokens=4,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    prefill = '<tool_call>{"name": "get_weather", "arguments":'
    assert forced.usage.prompt_tokens == len(renderer.prompt(TOOL_PROMPT, prefill=prefill))
    # 4 tokens cannot finish the call: a truncated call is returned as text
    assert forced.choices[0].message.content.startswith(prefill) and forced.choices[0].finish_reason == "length"
    # streaming: the same text as the non-streamed response
    kwargs = dict(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], max_tokens=8, temperature=0)
    text = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True) if c.choices
    )
    assert text == client.chat.completions.create(**kwargs).choices[0].message.content
    # the endpoint check: constrained decoding makes even this random model's forced calls well-formed
    report = check_endpoint(server.url, api_key=KEY, only=["tools"])
    assert [(r["name"], r["status"]) for r in report["results"]] == [("models", "pass"), ("tools", "pass")], report


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"messages": TOOL_PROMPT + [{"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
        (
            {"messages": TOOL_PROMPT + [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "a"}}]}]},
            "messages[1].tool_calls",
        ),
        (
            {
                "messages": [
                    TOOL_PROMPT[0],
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}
                        ],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_bad_tool_requests_are_openai_400s(real, kwargs, param):
    _, client = real
    body = {"model": "tiny", "messages": TOOL_PROMPT, "max_tokens": 1, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**body)
    assert info.value.body["param"] == param and info.value.body["message"]


class ScriptedClient:
    """A sampling client that answers by the prompt: a weather call, then (after a tool turn) the answer."""

    def __init__(self, tokenizer, call_text):
        self.tokenizer, self.call_text, self.prompts = tokenizer, call_text, []

    def get_tokenizer(self):
        return self.tokenizer

    def sample(self, prompt, num_samples=1, sampling_params=None, **_):
        ids = prompt if isinstance(prompt, list) else prompt.to_ints()
        self.prompts.append(ids)
        text = self.tokenizer.decode(ids)
        if "<|im_start|>tool" in text:
            out = ANSWER
        else:
            head = text[text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n") :]  # a prefill, if any
            out = self.call_text[len(head) :] if self.call_text.startswith(head) else self.call_text
        tokens = list(self.tokenizer.encode(out, add_special_tokens=False)) + [
            self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        seq = SampledSequence(stop_reason=StopReason.STOP, tokens=tokens, logprobs=[-0.1] * len(tokens))
        return APIFuture.completed(
            SampleResponse(
                sequences=[seq] * num_samples, usage=TokenUsage(prefill_tokens=len(ids), decode_tokens=len(tokens))
            )
        )


@pytest.fixture()
def scripted(tok):
    from rlkit.serve import FixedModel

    calls = format_call("get_weather", {"city": "Oslo"}) + "\n" + format_call("get_weather", {"city": "Bergen"})
    fake = ScriptedClient(tok, calls)
    server = serve(FixedModel(fake, name="tiny"))
    with openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60) as client:
        yield fake, client, server
    server.stop()


def test_tool_calls_and_an_agent_loop(scripted, tok):
    fake, client, _ = scripted
    r = client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Oslo"}),
        ("function", "get_weather", {"city": "Bergen"}),
    ]
    assert all(c.id.startswith("call_") for c in calls) and len({c.id for c in calls}) == 2
    assert fake.prompts[-1] == ToolRenderer(tok, [WEATHER_TOOL]).prompt(TOOL_PROMPT)
    # the agent runs the tools and sends the results back with their ids
    messages = (
        TOOL_PROMPT
        + [choice.message.model_dump(exclude_none=True)]
        + [{"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in calls]
    )
    final = client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER_TOOL])
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content == ANSWER
    assert tok.decode(fake.prompts[-1]).count("<|im_start|>tool\nsunny<|im_end|>") == 2
    one = client.chat.completions.create(
        model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], parallel_tool_calls=False
    )
    assert len(one.choices[0].message.tool_calls) == 1
    none = client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice="none")
    assert none.choices[0].finish_reason == "stop" and none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content.startswith("<tool_call>")


def test_streamed_tool_calls(scripted):
    _, client, _ = scripted
    chunks = list(client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = {}
    for chunk in chunks:
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            entry["id"] = d.id or entry["id"]
            entry["name"] = d.function.name if d.function and d.function.name else entry["name"]
            entry["arguments"] += (d.function.arguments or "") if d.function else ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_weather", {"city": "Bergen"}),
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_forced_call_prefill_and_the_endpoint_check(scripted, tok):
    fake, client, server = scripted
    forced = client.chat.completions.create(
        model="tiny",
        messages=TOOL_PROMPT,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    assert tok.decode(fake.prompts[-1]).endswith(
        '<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments":'
    )
    required = client.chat.completions.create(
        model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert required.choices[0].message.tool_calls[0].function.name == "get_weather"
    report = check_endpoint(server.url, api_key=KEY, only=["tools"])
    assert [(r["name"], r["status"]) for r in report["results"]] == [("models", "pass"), ("tools", "pass")], report
