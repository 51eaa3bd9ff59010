"""The CUDA decode path's logic, on the CPU: shape buckets, and the static-shape step (what a CUDA
graph captures) against the model's own forward. The capture itself needs a GPU
(``benchmarks/gpu_check.sh``); on the CPU the sampler never takes this path."""

import pytest
import torch

from rlkit.backends.local import cuda_decode
from rlkit.backends.local.cuda_decode import GraphedDecoder, bucket_length, bucket_rows, buckets_in_use
from rlkit.backends.local.models import load_model
from rlkit.backends.local.sampler import SampleRequest, Sampler
from rlkit.types import SamplingParams

PROMPT = [1, 85, 91, 326, 71, 79, 201]


def test_buckets_are_powers_of_two_with_a_minimum_length():
    assert [bucket_rows(n) for n in (0, 1, 2, 3, 5, 64, 65, 256)] == [1, 1, 2, 4, 8, 64, 128, 256]
    assert [bucket_length(n) for n in (1, 127, 128, 129, 300)] == [128, 128, 128, 256, 512]
    assert cuda_decode.MIN_LENGTH == 128


def requests():
    """Shared and distinct prompts, rows finishing at different steps (the 11 rows shrink through
    the 16, 8 and 4 row buckets), one sample running through the 32- and 64-column buckets (with
    the minimum length cut to 16) into 128."""
    return [
        SampleRequest(PROMPT, 3, SamplingParams(max_tokens=12, temperature=1.0, seed=3)),
        SampleRequest(PROMPT[:4], 2, SamplingParams(max_tokens=5, temperature=0.7, seed=4)),
        SampleRequest(PROMPT, 2, SamplingParams(max_tokens=9, temperature=0.0)),
        SampleRequest(list(range(5, 30)), 3, SamplingParams(max_tokens=20, temperature=1.0, seed=5)),
        SampleRequest(list(range(40, 50)), 1, SamplingParams(max_tokens=60, temperature=1.0, seed=6)),
    ]


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_static_bucketed_step_samples_what_the_models_forward_samples(name, monkeypatch):
    monkeypatch.setattr(cuda_decode, "MIN_LENGTH", 16)
    lm = load_model(name)
    plain = Sampler(lm.model, lm.tokenizer, [], fused=False)
    static = Sampler(lm.model, lm.tokenizer, [])
    assert static.graphed is None  # the CPU path is FusedDecode, unchanged
    static.graphed = GraphedDecoder(static.fused, use_graphs=False)  # what CUDA runs, eagerly, here
    got, want = static.sample(requests()), plain.sample(requests())
    for g, w in zip(got, want):
        for s, t in zip(g.sequences, w.sequences):
            assert s.tokens == t.tokens
            assert s.logprobs == pytest.approx(t.logprobs, abs=2e-5)
    assert len(got[4].sequences[0].tokens) == 60
    used = set(buckets_in_use(static.graphed))
    assert {(16, 32), (1, 128)} <= used and static.graphed.captures == 0
    again = static.sample(requests())  # the same buckets again, reused
    assert [s.tokens for r in again for s in r.sequences] == [s.tokens for r in got for s in r.sequences]
    assert len(static.graphed.buckets) <= cuda_decode.MAX_BUCKETS


def start_one_row(g):
    n = len(PROMPT)
    return g.start(torch.tensor([PROMPT]), torch.ones(1, n, dtype=torch.long), torch.arange(n)[None], torch.tensor([0]))


def test_a_bucket_is_captured_only_after_it_keeps_being_used(monkeypatch):
    """The capture policy, with the capture stubbed (it needs CUDA): a bucket runs eagerly for its
    first CAPTURE_AFTER steps, is then captured once and replayed; a failed capture stays eager,
    with the same results."""
    lm = load_model("tiny")
    fused = Sampler(lm.model, lm.tokenizer, []).fused
    monkeypatch.setattr(cuda_decode, "_is_cuda", lambda t: True)
    eager = start_one_row(GraphedDecoder(fused, use_graphs=False))
    want = [eager.step(torch.tensor([5 + i])) for i in range(cuda_decode.CAPTURE_AFTER + 3)]

    g = GraphedDecoder(fused, use_graphs=True)
    replays = []

    class FakeGraph:  # replays what was captured: one static step
        def __init__(self, b):
            self.b = b

        def replay(self):
            replays.append(1)
            g.compute(self.b)

    def capture(b):
        g.captures += 1
        b.graph = FakeGraph(b)

    monkeypatch.setattr(g, "_capture", capture)
    state = start_one_row(g)
    got = [state.step(torch.tensor([5 + i])) for i in range(cuda_decode.CAPTURE_AFTER + 3)]
    assert g.captures == 1 and len(replays) == 3
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    def broken(b):
        raise RuntimeError("operation not permitted when stream is capturing")

    g2 = GraphedDecoder(fused, use_graphs=True)
    monkeypatch.setattr(g2, "_capture", broken)
    s2 = start_one_row(g2)
    got = [s2.step(torch.tensor([5 + i])) for i in range(cuda_decode.CAPTURE_AFTER + 3)]
    assert s2.b.failed and s2.b.graph is None and g2.captures == 0
    torch.testing.assert_close(got[-1], want[-1], atol=0, rtol=0)
