"""rlkit.chat renders exactly what the tokenizer's own chat template renders, and its weights
mark exactly the assistant turns (content + end-of-turn), for the tiny and the real tokenizer."""

import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.chat import conversation_datum, prompt_tokens, render_conversation
from rlkit.data import gsm8k_messages

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "2 + 3 = 5.\n#### 5"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Blue, or green — or ünïcödé 🎨."},
    ],
    gsm8k_messages({"question": "Natalia sold clips to 48 of her friends in April.", "answer": "48/2 = <<48/2=24>>24\n#### 72"}),
]


def template_ids(tokenizer, messages, **kw):
    out = tokenizer.apply_chat_template(messages, tokenize=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def weighted_spans(weights):
    spans, start = [], None
    for i, w in enumerate(weights + [0.0]):
        if w and start is None:
            start = i
        elif not w and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2-135m-instruct", marks=pytest.mark.slow)])
def tokenizer(request):
    return load_tokenizer(request.param)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_tokens_equal_apply_chat_template(tokenizer, messages):
    rendered = render_conversation(tokenizer, messages)
    assert rendered.tokens == template_ids(tokenizer, messages)
    assert prompt_tokens(tokenizer, messages[:-1]) == template_ids(tokenizer, messages[:-1], add_generation_prompt=True)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_weights_mark_exactly_the_assistant_turns(tokenizer, messages):
    rendered = render_conversation(tokenizer, messages)
    assistant = [m["content"] for m in messages if m["role"] == "assistant"]
    spans = weighted_spans(rendered.weights)
    assert len(spans) == len(assistant)
    end_of_turn = "<|im_end|>"
    for (a, b), content in zip(spans, assistant):
        text = tokenizer.decode(rendered.tokens[a:b])
        assert text.startswith(content) and text[len(content):].strip() == end_of_turn
        before = tokenizer.decode(rendered.tokens[:a])
        assert before.endswith("assistant\n")  # the header is context, not trained
    last = render_conversation(tokenizer, messages, train_on="last_assistant")
    assert weighted_spans(last.weights) == spans[-1:]
    assert all(render_conversation(tokenizer, messages, train_on="all").weights)


def test_datum_shifts_weights_onto_the_predicting_positions(tokenizer):
    messages = CONVERSATIONS[0]
    rendered = render_conversation(tokenizer, messages)
    datum = conversation_datum(tokenizer, messages)
    tokens = datum.model_input.to_ints()
    targets = list(datum.loss_fn_inputs["target_tokens"].data)
    weights = list(datum.loss_fn_inputs["weights"].data)
    assert len(tokens) == len(targets) == len(weights)
    assert targets[:-1] == tokens[1:]
    assert weights == rendered.weights[1:] + [0.0]


def test_truncation(tokenizer):
    rendered = render_conversation(tokenizer, CONVERSATIONS[1], max_length=12)
    assert len(rendered.tokens) == len(rendered.weights) == 12
    from rlkit.errors import DataError

    with pytest.raises(DataError, match="exceed max_length"):
        render_conversation(tokenizer, CONVERSATIONS[1], max_length=12, truncation="error")
