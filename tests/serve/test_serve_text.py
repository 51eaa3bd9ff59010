"""Token ids -> choice text: pieces, stop sequences, end-of-turn token, logprob entries; and request parsing."""

from __future__ import annotations

import random

import pytest

from rlkit.backends.local.models import load_tokenizer
from rlkit.serve.protocol import APIError, Limits, parse_chat_request
from rlkit.serve.text import TokenText, finish_choice, logprob_entry


@pytest.fixture(scope="module")
def tt():
    return TokenText(load_tokenizer("tiny"))


def test_pieces_spell_the_decoded_text(tt):
    tok = tt.tokenizer
    ids = tok.encode("héllo wörld — 世界 ok\n\tend", add_special_tokens=False)
    pieces = tt.pieces(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == tok.decode(ids)
    rng = random.Random(0)
    for _ in range(20):  # arbitrary (often invalid UTF-8) byte-level sequences
        ids = [rng.randrange(3, len(tok)) for _ in range(rng.randrange(1, 30))]
        assert "".join(tt.pieces(ids)) == tok.decode(ids, skip_special_tokens=True)


def test_token_bytes_are_raw_bytes(tt):
    ids = tt.tokenizer.encode("世界 x", add_special_tokens=False)
    assert b"".join(tt.token_bytes(i) for i in ids) == "世界 x".encode()


def test_stop_sequence_cut_inside_a_token(tt):
    tok = tt.tokenizer
    ids = tok.encode("one two three four", add_special_tokens=False)
    lps = [-float(i) for i in range(len(ids))]
    c = finish_choice(tt, ids, lps, stopped=False, stops=["ree", "zzz"])
    assert c.text == "one two th" and c.finish_reason == "stop"
    assert "".join(c.pieces) == c.text and len(c.tokens) == len(c.logprobs) == len(c.pieces)
    assert tok.decode(c.tokens).startswith(c.text) and c.logprobs == lps[: len(c.tokens)]
    assert c.generated == len(ids)
    # a stop sequence at the very start keeps nothing
    c = finish_choice(tt, ids, lps, stopped=True, stops=["one"])
    assert c.text == "" and c.tokens == [] and c.finish_reason == "stop"


def test_end_of_turn_token_is_counted_but_not_text(tt):
    tok = tt.tokenizer
    ids = tok.encode("hi there", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    c = finish_choice(tt, ids, [-1.0] * len(ids), stopped=True, stops=[])
    assert c.text == "hi there" and c.finish_reason == "stop" and c.generated == len(ids) and len(c.tokens) == len(ids) - 1
    c = finish_choice(tt, ids[:-1], None, stopped=False, stops=[])
    assert c.finish_reason == "length"


def test_logprob_entry_shape(tt):
    e = logprob_entry(tt, 201, -0.5, [(201, -0.5), (85, -1.0)])
    assert e["token"] == "\n" and e["bytes"] == [10] and e["logprob"] == -0.5
    assert [t["logprob"] for t in e["top_logprobs"]] == [-0.5, -1.0]


def test_parse_request_fields():
    req = parse_chat_request(
        {
            "model": "m",
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "user", "content": "q"}],
            "max_completion_tokens": 7, "stop": "x", "n": 2, "seed": 3, "logprobs": True, "top_logprobs": 1,
            "stream": True, "stream_options": {"include_usage": True}, "user": "ignored",
        },
        Limits(),
    )
    assert req.messages[0] == {"role": "system", "content": "a\nb"}
    assert (req.max_tokens, req.stop, req.n, req.seed, req.top_logprobs, req.include_usage) == (7, ["x"], 2, 3, 1, True)
    with pytest.raises(APIError) as info:
        parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 5, "max_completion_tokens": 6}, Limits())
    assert info.value.status == 400 and info.value.param == "max_completion_tokens"
    with pytest.raises(APIError):
        parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "q"}], "stream_options": {"include_usage": True}}, Limits())
    with pytest.raises(APIError):
        parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "q"}], "n": True}, Limits())
