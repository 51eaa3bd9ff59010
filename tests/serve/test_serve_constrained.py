"""Issue 28's table, rerun with the official ``openai`` client against ``rlkit serve`` on the random
tiny model: only constrained decoding can make these well-formed, so every row is structural."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from rlkit.serve.checker import TOOL_PROMPT, WEATHER_TOOL, check_endpoint

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

NAMED = {"type": "function", "function": {"name": "get_weather"}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "h24": {"type": "boolean"}}, "required": ["city", "h24"]}}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["C", "F"]},
                                           "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
          "required": ["answer", "unit"], "additionalProperties": False}
PARAMS = {t["function"]["name"]: dict(t["function"]["parameters"], additionalProperties=False) for t in (WEATHER_TOOL, TIME_TOOL)}


def only_call(choice):
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    call = choice.message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    return call


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_named_tool_choice_is_a_schema_valid_call(client, seed):
    r = client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL, TIME_TOOL],
                                       tool_choice=NAMED, seed=seed, max_tokens=64)
    assert only_call(r.choices[0]).function.name == "get_weather"


def test_required_is_a_schema_valid_call_of_a_known_tool(client):
    names = set()
    for seed in (4, 5, 6):
        r = client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL, TIME_TOOL],
                                           tool_choice="required", seed=seed, max_tokens=64, n=2)
        names |= {only_call(c).function.name for c in r.choices}
    assert names <= {"get_weather", "get_time"}
    single = client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice="required")
    assert only_call(single.choices[0]).function.name == "get_weather"  # one tool: named (fits the default 32 tokens)


def test_the_named_call_streamed_assembles_to_valid_json(client):
    name, args, finish = "", "", None
    for chunk in client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice=NAMED,
                                                seed=7, max_tokens=64, stream=True):
        for c in chunk.choices:
            for call in c.delta.tool_calls or []:
                name += call.function.name or ""
                args += call.function.arguments or ""
            finish = c.finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls"
    jsonschema.validate(json.loads(args), PARAMS["get_weather"])


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_content_fits(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    for temperature, seed in ((0, None), (1, 1), (1, 2)):
        kwargs = dict(model="tiny", messages=TOOL_PROMPT, response_format=fmt, temperature=temperature, seed=seed, max_tokens=64)
        if stream:  # live content deltas
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True) if c.choices)
        else:
            r = client.chat.completions.create(**kwargs)
            assert r.choices[0].finish_reason == "stop"
            text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), ANSWER)


def test_response_format_json_object_is_an_object(client):
    r = client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, response_format={"type": "json_object"}, seed=3, max_tokens=64)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_schema_that_cannot_compile_is_a_400_naming_where(client):
    bad = {"type": "object", "properties": {"when": {"type": "object", "properties": {"day": {"type": "integr"}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, max_tokens=8,
                                       response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": bad}})
    body = err.value.body
    assert err.value.status_code == 400 and body["param"] == "response_format.json_schema.schema"
    assert "at #/properties/when/properties/day: Invalid type: integr" in body["message"] and body["type"] == "invalid_request_error"
    tool = {"type": "function", "function": {"name": "f", "parameters": bad}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, max_tokens=8, tools=[WEATHER_TOOL, tool], tool_choice="required")
    assert err.value.body["param"] == "tools[1].function.parameters"
    assert "Invalid schema for function 'f': at #/properties/when/properties/day" in err.value.body["message"]
    for fmt, param in (({"type": "xml"}, "response_format.type"), ({"type": "json_schema"}, "response_format.json_schema"),
                       ({"type": "json_schema", "json_schema": {"schema": ANSWER}}, "response_format.json_schema.name")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny", messages=TOOL_PROMPT, max_tokens=8, response_format=fmt)
        assert err.value.body["param"] == param


def test_the_endpoint_checker_reports_pass(tiny_server, api_key):
    report = check_endpoint(tiny_server.url, api_key=api_key, only=["tools", "response_format"])
    assert [(r["name"], r["status"]) for r in report["results"]] == [
        ("models", "pass"), ("tools", "pass"), ("response_format", "pass")], report
