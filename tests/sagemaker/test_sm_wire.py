"""Per-token floats go on the wire no longer than float32 needs, so the SDK's size estimate (~10
bytes a value, ``_utils._estimate_datum_bytes``) holds and its chunks fit the runtime's request
limit. A GSM8K-sized RL batch (360 sequences of 500 tokens, five per-token inputs: over one
request) goes through the SDK to the strict emulator, whose limit is 10 MiB."""

import json

import numpy as np
import torch
from sm_support import REGION, ROLE, require_sdk, running_emulator, tiny_arn

sdk = require_sdk()

from sagemaker.train.training_session import _utils as sdk_utils  # noqa: E402

from rlkit.backends.sagemaker import convert  # noqa: E402
from rlkit.types import Datum, ModelInput, TensorData  # noqa: E402
import pytest  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def rl_batch(n=360, prompt=100, completion=400, vocab=500, seed=0):
    """Datums as the RL loop builds them: sampler logprobs, a per-sequence advantage, the temperature."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = rng.integers(0, vocab, prompt + completion + 1).tolist()
        lp = np.concatenate([np.zeros(prompt), np.log(rng.uniform(1e-3, 1.0, completion))]).astype(np.float32)
        adv = float(np.float32(rng.normal()))
        inputs = {
            "target_tokens": TensorData(data=tokens[1:], dtype="int64"),
            "weights": TensorData(data=[0.0] * prompt + [1.0] * completion),
            "logprobs": TensorData.from_torch(torch.tensor(lp)),
            "advantages": TensorData(data=[0.0] * prompt + [adv] * completion),
            "temperature": TensorData(data=[1.0] * (prompt + completion)),
        }
        out.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs))
    return out


def body_bytes(datums):
    """What botocore's rest-json serializer sends for these datums (``json.dumps`` defaults)."""
    return len(
        json.dumps({"operationConfig": {"forward": {"lossFnName": "ppo", "datumList": datums}}, "sequenceNumber": 1})
    )


def test_compact_floats_read_back_as_the_same_float32():
    values = np.log(np.random.default_rng(1).uniform(1e-6, 1.0, 10_000)).astype(np.float32).tolist() + [
        0.1,
        -0.0,
        1e-30,
        3.4e38,
    ]
    compact = convert.compact_floats(values)
    assert np.array_equal(np.asarray(compact, dtype=np.float32), np.asarray(values, dtype=np.float32))
    assert max(len(repr(v)) for v in compact) <= 15 < max(len(repr(v)) for v in values)


def test_the_sdks_estimate_holds_where_float64_reprs_overshoot_the_limit():
    batch = rl_batch(prompt=40, completion=470, vocab=49152)  # SmolLM2's vocabulary: five-digit token ids
    wire = [convert.datum_to_wire(d) for d in batch]
    chunks = sdk_utils.chunk_datum_list(wire)
    assert len(chunks) == 2  # over one request: the SDK splits it by its estimate
    for chunk in chunks:
        assert body_bytes(chunk) <= sum(sdk_utils._estimate_datum_bytes(d) for d in chunk)
    # what rlkit sent before, float64 reprs of float32 values: over the estimate, and over 10 MiB
    long_form = [
        {"modelInput": d["modelInput"], "lossFnInputs": {k: v.model_dump_wire() for k, v in src.loss_fn_inputs.items()}}
        for d, src in zip(wire, batch)
    ]
    first = long_form[: len(chunks[0])]
    assert body_bytes(first) > sum(sdk_utils._estimate_datum_bytes(d) for d in first)
    assert body_bytes(first) > 10 * 1024 * 1024


def test_a_gsm8k_sized_batch_goes_through_the_strict_emulator(tmp_path):
    wire = [convert.datum_to_wire(d) for d in rl_batch()]
    assert len(sdk_utils.chunk_datum_list(wire)) == 2
    with running_emulator(tmp_path) as emu:
        svc = sdk.ServiceClient(region=REGION, role_arn=ROLE, s3_output_path="s3://rlkit-tests/out")
        tc = svc.create_lora_training_client(tiny_arn(), rank=4, alpha=8)
        out = tc.forward(wire, "ppo").result(timeout=600)  # the SDK chunks; every chunk is accepted
        assert out.metrics["global_token_num"] == sum(len(d["modelInput"]["chunks"][0]["tokens"]) for d in wire)
        stats = emu.state.stats
        assert stats["requests_too_large"] == 0 and stats["requests:ExecuteTrainingOperation"] >= 2
        assert 0.5 * 10_000_000 < stats["largest_request_bytes"] <= 10 * 1024 * 1024
        tc.stop()
