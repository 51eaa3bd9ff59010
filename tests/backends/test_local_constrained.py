"""Constrained decoding in the local sampler (rlkit.constraints): token masks on the tiny model's
512-token vocabulary, in both decode loops, and the engines that refuse a constraint."""

import json
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from rlkit import constraints
from rlkit.backends.local.models import load_model
from rlkit.backends.local.sampler import SampleRequest, Sampler
from rlkit.errors import InvalidInputError
from rlkit.types import Constraint, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
PROMPT = [1, 85, 91, 326, 71]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def accepted(tokenizer, constraint, tokens, eos=(0, 2)):
    """Whether a fresh matcher of ``constraint`` takes every token and ends finished."""
    m = constraints.compiled(tokenizer, 512, list(eos), constraint).deep_copy()
    return m.try_consume_tokens(list(tokens)) == len(tokens) and (m.is_stopped() or m.is_accepting())


def test_the_mask_is_the_grammars_and_unpacks_bit_by_bit(tiny):
    tok = tiny.tokenizer
    c = Constraint(regex="(ab|cd)+")
    m = constraints.compiled(tok, 512, [2], c).deep_copy()
    rows = constraints.RowMatchers(m, [2])
    mask = rows.allowed([0], 512)[0]
    bias = m.compute_logit_bias()  # one byte per token, 0 = forbidden
    assert mask.tolist() == [b != 0 for b in bias] and 0 < int(mask.sum()) < 512
    words = torch.tensor([[0b101, -1]], dtype=torch.int32)
    assert constraints.unpack_bitmask(words, 34)[0].nonzero().flatten().tolist() == [0, 2, 32, 33]


@pytest.mark.parametrize("fused", [True, False], ids=["fused-decode", "models-own-forward"])
def test_constrained_samples_are_always_accepted_in_both_decode_paths(tiny, fused):
    sampler = Sampler(tiny.model, tiny.tokenizer, [2, 0], fused=fused)
    assert (sampler.fused is not None) == fused
    json_c = Constraint(json_schema=SCHEMA)
    lark_c = Constraint(lark='start: "yes" | "no" | "n/a"')
    requests = [
        SampleRequest(PROMPT, 3, SamplingParams(max_tokens=60, temperature=1.0, seed=seed, constraint=json_c)) for seed in (1, 2, 3)
    ] + [
        SampleRequest(PROMPT, 1, SamplingParams(max_tokens=60, temperature=0.0, constraint=json_c)),
        SampleRequest(PROMPT[:3], 2, SamplingParams(max_tokens=8, temperature=1.0, seed=4, constraint=lark_c)),
        SampleRequest(PROMPT, 2, SamplingParams(max_tokens=6, temperature=1.0, seed=5)),  # unconstrained batchmate
    ]
    out = sampler.sample(requests)
    for req, resp in zip(requests[:5], out[:5]):
        for seq in resp.sequences:
            assert seq.stop_reason.value == "stop"
            body = seq.tokens[:-1] if seq.tokens[-1] in (0, 2) else seq.tokens
            assert accepted(tiny.tokenizer, req.params.constraint, body)
            text = tiny.tokenizer.decode(body)
            if req.params.constraint is json_c:
                jsonschema.validate(json.loads(text), SCHEMA)
            else:
                assert text in ("yes", "no", "n/a")
            assert all(lp <= 0 for lp in seq.logprobs)  # unmasked logprobs: finite, <= 0
    assert [len(s.tokens) for s in out[5].sequences] == [6, 6]
    if fused:  # the two loops pick the same tokens under the same masks
        plain = Sampler(tiny.model, tiny.tokenizer, [2, 0], fused=False).sample([SampleRequest(PROMPT, 3, r.params) for r in requests[:3]])
        assert [s.tokens for r in plain for s in r.sequences] == [s.tokens for r in out[:3] for s in r.sequences]


def test_a_tight_budget_still_finishes_the_json(tiny):
    """A random model writes strings for ever; near max_tokens the row follows the finishing policy
    (the shortest text here is ~31 tokens of this 512-token vocabulary)."""
    sampler = Sampler(tiny.model, tiny.tokenizer, [2, 0])
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=9, constraint={"json_schema": SCHEMA})
    out = sampler.sample([SampleRequest(PROMPT, 4, params)])[0]
    for seq in out.sequences:
        assert len(seq.tokens) <= 40 and seq.stop_reason.value == "stop"
        body = seq.tokens[:-1] if seq.tokens[-1] in (0, 2) else seq.tokens
        jsonschema.validate(json.loads(tiny.tokenizer.decode(body)), SCHEMA)


def test_without_stop_tokens_a_finished_grammar_ends_the_sample(tiny):
    sampler = Sampler(tiny.model, tiny.tokenizer, [])  # no end-of-turn tokens: would run to max_tokens
    params = SamplingParams(max_tokens=50, temperature=1.0, seed=2, constraint={"regex": "[0-9]{3}"})
    seq = sampler.sample([SampleRequest(PROMPT, 1, params)])[0].sequences[0]
    text = tiny.tokenizer.decode(seq.tokens, skip_special_tokens=True)
    assert len(text) == 3 and text.isdigit() and seq.stop_reason.value == "stop" and len(seq.tokens) <= 4


def test_constraint_field_is_strict():
    assert SamplingParams().constraint is None and SamplingParams().max_tokens == 512
    with pytest.raises(InvalidInputError, match="exactly one of json_schema, lark, regex"):
        SamplingParams(constraint={"json_schema": {"type": "object"}, "regex": "a"})
    with pytest.raises(InvalidInputError, match="schema"):
        SamplingParams(constraint={"schema": {}})


def test_a_schema_that_cannot_compile_is_refused_naming_where(service):
    client = service.create_sampling_client(base_model="tiny")
    assert service.capabilities.constrained_decoding
    bad = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "strng"}}}}}
    with pytest.raises(InvalidInputError, match=r"sample: sampling_params.constraint: .*#/properties/a/properties/b: Invalid type: strng"):
        client.sample(PROMPT, sampling_params={"constraint": {"json_schema": bad}})
    with pytest.raises(InvalidInputError, match="unknown name"):
        client.sample(PROMPT, sampling_params={"constraint": {"lark": "start: nothere"}})
    assert constraints.schema_problem({"$defs": {"x": {"type": "bad"}}, "properties": {"a": {"$ref": "#/$defs/x"}}})[0] == "#/$defs/x"
    assert constraints.schema_problem(SCHEMA) is None


def test_sagemaker_and_tinker_refuse_a_constraint_in_one_line():
    from rlkit.backends.sagemaker.sampling import SageMakerSamplingClient
    from rlkit.backends.tinker.clients import TinkerSamplingClient

    params = {"max_tokens": 512, "constraint": {"regex": "[0-9]+"}}
    sm = SageMakerSamplingClient(None, SimpleNamespace(training_session_name="s"), base_model="tiny", owns_session=False)
    with pytest.raises(InvalidInputError, match=r"^sample: sampling_params.constraint cannot be honoured on sagemaker: [^\n]*$"):
        sm.sample([1, 2, 3], sampling_params=params)
    tk = TinkerSamplingClient(None, lambda: None)
    with pytest.raises(InvalidInputError, match=r"^sample: sampling_params.constraint cannot be honoured on tinker: [^\n]*$"):
        tk.sample([1, 2, 3], sampling_params=params)
