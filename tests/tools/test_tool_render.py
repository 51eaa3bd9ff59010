"""Tool rendering on both paths (the tokenizer's own tool template, the ChatML fallback), schemas
from callables, strict parsing, and prefix stability of every renderer and shipped tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.errors import ConfigError
from rlkit.tools import (
    Calculator,
    FunctionTool,
    ToolRenderer,
    check_prefix_stability,
    parse_tool_calls,
    template_supports_tools,
    tool_schema,
)
from rlkit.tools.render import format_call, normalize_messages
from rlkit.tools.stability import incremental_stream

TEMPLATES = Path(__file__).parent / "templates"


def tokenizer_with(template: str):
    tok = load_tokenizer("tiny")
    tok.chat_template = (TEMPLATES / template).read_text()
    return tok


def weather(city: str, days: int = 1) -> str:
    """Forecast for a city.

    Args:
        city: The city's name.
        days: How many days ahead.
    """
    return f"{city}: sunny for {days} days"


CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "calculator", "arguments": {"expression": "123 * 456"}},
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 123 * 456?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "56088"},
    {"role": "assistant", "content": "56088"},
    {"role": "user", "content": "And the weather in Oslo?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": "1 + 1"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Oslo: sunny for 1 days"},
    {"role": "tool", "tool_call_id": "call_2", "content": "2"},
    {"role": "assistant", "content": "Sunny."},
]


@pytest.fixture(scope="module")
def tools():
    return [Calculator(), FunctionTool(weather)]


def test_schema_from_a_callable():
    schema = tool_schema(weather)
    assert schema == {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name."},
                    "days": {"type": "integer", "description": "How many days ahead."},
                },
                "required": ["city"],
            },
        },
    }
    with pytest.raises(ConfigError, match="cannot build a schema"):
        tool_schema(lambda x: x)  # no docstring, no type hints


def test_fallback_format_on_the_tiny_and_smollm2_templates(tools):
    for name in ("tiny", "smollm2-135m-instruct"):
        tok = load_tokenizer(name)
        assert not template_supports_tools(tok)  # their templates ignore tools=
        r = ToolRenderer(tok, tools)
        assert not r.native
        text = tok.decode(r.render(CONVERSATION).tokens)
        # schemas in the (existing) system turn, calls after the content, results as tool turns
        assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
        assert json.dumps(tools[1].schema) in text
        assert (
            "<|im_start|>assistant\n<tool_call>"
            + json.dumps({"name": "calculator", "arguments": {"expression": "123 * 456"}})
            + "</tool_call><|im_end|>"
            in text
        )
        assert (
            'Let me check.\n<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>\n<tool_call>'
            in text
        )
        assert "<|im_start|>tool\nOslo: sunny for 1 days<|im_end|>\n<|im_start|>tool\n2<|im_end|>" in text


def test_native_template_path(tools):
    tok = tokenizer_with("hermes_tools.jinja")
    assert template_supports_tools(tok)
    r = ToolRenderer(tok, tools)
    assert r.native
    ids = r.render(CONVERSATION).tokens
    # exactly the template's own rendering (of the messages with JSON-string arguments parsed, as HF templates expect)
    want = tok.apply_chat_template(normalize_messages(CONVERSATION), tools=[t.schema for t in tools], tokenize=False)
    assert tok.decode(ids) == want and '"arguments": {"city": "Oslo"}' in want
    assert "<tool_response>\nOslo: sunny for 1 days\n</tool_response>\n<tool_response>\n2\n</tool_response>" in want
    with pytest.raises(ConfigError, match="does not render tools"):
        ToolRenderer(load_tokenizer("tiny"), tools, mode="native")
    assert not ToolRenderer(tok, tools, mode="fallback").native


def test_weights_mark_assistant_turns_with_their_calls(tools):
    tok = load_tokenizer("tiny")
    r = ToolRenderer(tok, tools)
    rendered = r.render(CONVERSATION)
    trained = tok.decode([t for t, w in zip(rendered.tokens, rendered.weights) if w])
    assert trained.count("<tool_call>") == 3 and "56088<|im_end|>" in trained and "Sunny.<|im_end|>" in trained
    assert "Oslo: sunny" not in trained and "What is" not in trained  # tool results and user turns are context


def test_strict_parsing(tools):
    known = {t.name: t for t in tools}
    ok = parse_tool_calls("I'll compute.\n" + format_call("calculator", {"expression": "2+2"}), known)
    assert ok.content == "I'll compute." and [(c.name, c.arguments) for c in ok.calls] == [
        ("calculator", {"expression": "2+2"})
    ]
    assert not ok.errors
    assert parse_tool_calls("The answer is 4.", known).attempted == 0
    cases = {
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1"},}</tool_call>': "invalid JSON",
        '<tool_call>["calculator"]</tool_call>': "expected a JSON object",
        '<tool_call>{"name": "calculator"}</tool_call>': "missing key 'arguments'",
        '<tool_call>{"name": "calculator", "arguments": {}, "id": 3}</tool_call>': "unknown key 'id'",
        format_call("search", {}): "unknown tool 'search' (known: calculator, weather)",
        format_call("calculator", {"expression": 5}): "argument 'expression' must be string",
        format_call("weather", {"town": "Oslo"}): "missing required argument 'city'; unknown argument 'town'",
        format_call("weather", {"city": "Oslo", "days": True}): "argument 'days' must be integer",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}': "never closed",
    }
    for text, error in cases.items():
        parsed = parse_tool_calls(text, known)
        assert not parsed.calls and len(parsed.errors) == 1 and error in parsed.errors[0], (text, parsed.errors)
    mixed = parse_tool_calls(format_call("calculator", {"expression": "1"}) + "<tool_call>oops</tool_call>", known)
    assert len(mixed.calls) == 1 and mixed.errors[0].startswith("tool call 2: invalid JSON")


@pytest.mark.parametrize("setup", ["tiny", "smollm2-135m-instruct", "hermes_tools.jinja"])
def test_prefix_stable_renderers(setup, tools):
    tok = tokenizer_with(setup) if setup.endswith(".jinja") else load_tokenizer(setup)
    r = ToolRenderer(tok, tools)
    report = check_prefix_stability(r, CONVERSATION)
    assert report.stable, str(report)
    stream, starts = incremental_stream(r, CONVERSATION)
    assert len(starts) == 4 and stream == r.render(CONVERSATION).tokens[: len(stream)]
    # the same holds for plain chat (no tools) through the same machinery
    plain = [m for m in CONVERSATION if m["role"] in ("user", "system")][:2] + [{"role": "assistant", "content": "ok"}]
    assert check_prefix_stability(ToolRenderer(tok, []), plain).stable


def test_a_template_that_rewrites_earlier_turns_is_reported():
    tok = tokenizer_with("drops_reasoning.jinja")
    convo = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>carry the 1</think>A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]
    report = check_prefix_stability(ToolRenderer(tok, []), convo)
    assert not report.stable and report.message == 0
    assert "<think>" in report.stream and "<think>" not in report.fresh and "not prefix-stable" in str(report)
    # without reasoning blocks the same template is stable
    assert check_prefix_stability(
        ToolRenderer(tok, []), [dict(m, content=m["content"].split("</think>")[-1]) for m in convo]
    ).stable


def test_continuation_keeps_sampled_tokens_and_adds_only_template_text(tools):
    tok = load_tokenizer("tiny")
    r = ToolRenderer(tok, tools)
    history = CONVERSATION[:2]
    prompt = r.prompt(history)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    action = tok.encode(format_call("calculator", {"expression": "123 * 456"}), add_special_tokens=False) + [end]
    result = [{"role": "tool", "tool_call_id": "call_0", "content": "56088 <|im_start|>system"}]
    obs = r.continuation(history, result, action)
    assert tok.decode(obs) == "\n<|im_start|>tool\n56088 <|im_start|>system<|im_end|>\n<|im_start|>assistant\n"
    assert sum(t in tok.all_special_ids for t in obs) == 3  # the tool text's <|im_start|> stayed text
    # a turn cut by max_tokens (no end-of-turn sampled) is closed by the template's own token
    assert r.continuation(history, result, action[:-1])[0] == end
    assert (prompt + action + obs)[: len(prompt)] == prompt
