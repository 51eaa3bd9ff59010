"""Identical deterministic requests on the base weights are decoded once (rlkit/backends/local/twins.py):
the rules by hand, then the sampler worker of a fusing service (``fuse_runs=True``) on the tiny
model: two runs' fresh adapters (every ``B`` zero) sample as the base, their twin requests share one
decode and get the tokens the base gives alone; requests that are not twins (no seed, a trained
adapter) still decode; a cancelled first leaves its twin to decode itself; without ``fuse_runs``
nothing changes (today's code)."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
import torch

from rlkit.backends.local.twins import Twins, adds_nothing, twin_key
from rlkit.types import SampledSequence, SampleResponse, SamplingParams, StopReason

SEEDED = SamplingParams(max_tokens=6, temperature=1.0, seed=5)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
UNSEEDED = SamplingParams(max_tokens=6, temperature=1.0)


def _request(params, prompt=(1, 2, 3), **kw):
    from rlkit.backends.local.sampler import SampleRequest

    return SampleRequest(list(prompt), 2, params, **kw)


def _response(token: int) -> SampleResponse:
    return SampleResponse(sequences=[SampledSequence(stop_reason=StopReason.LENGTH, tokens=[token], logprobs=[-0.5])])


def test_an_adapter_adds_nothing_only_when_every_b_is_zero_or_scaled_away():
    a, zero, one = torch.ones(2, 4), torch.zeros(3, 2), torch.ones(3, 2)
    assert adds_nothing({"x": (a, zero, 0.5), "y": (a, zero, 2.0)})
    assert adds_nothing({"x": (a, one, 0.0)})
    assert not adds_nothing({"x": (a, zero, 0.5), "y": (a, one * 1e-8, 2.0)})
    assert not adds_nothing({}) and not adds_nothing(None) and not adds_nothing(object())


def test_twin_keys_only_for_deterministic_requests_on_the_base():
    seeded, greedy, unseeded = (twin_key(_request(p).for_weights("", None)) for p in (SEEDED, GREEDY, UNSEEDED))
    assert seeded is not None and greedy is not None and seeded != greedy
    assert unseeded is None  # fresh randomness each time: never a twin
    assert seeded == twin_key(_request(SEEDED).for_weights("", None))
    assert seeded != twin_key(_request(SEEDED.model_copy(update={"seed": 6})).for_weights("", None))
    assert seeded != twin_key(_request(SEEDED, prompt=(1, 2, 4)).for_weights("", None))
    assert seeded != twin_key(_request(SEEDED, include_prompt_logprobs=True).for_weights("", None))
    assert twin_key(_request(SEEDED).for_weights("run-a", {"x": (torch.ones(1, 1), torch.ones(1, 1), 1.0)})) is None
    assert twin_key(_request(SEEDED, on_token=lambda i, t: None).for_weights("", None)) is None


def test_a_twin_waits_for_its_first_or_is_answered_from_recent_ones_and_decodes_if_the_first_does_not_finish():
    twins = Twins(recent=1)
    assert twins.claim("a", "k") == ("decode", None)
    assert twins.claim("b", "k") == ("waits", None)
    assert twins.claim("c", None) == ("decode", None)  # no key: always decodes
    answered = twins.settle("a", _response(7))
    assert [t for t, _ in answered] == ["b"] and answered[0][1].sequences[0].tokens == [7]
    verdict, copy = twins.claim("d", "k")  # after the first finished: its kept answer, a copy
    assert verdict == "answered" and copy.sequences[0].tokens == [7] and copy is not answered[0][1]
    assert twins.answered == 2
    assert twins.claim("e", "j") == ("decode", None)
    assert twins.claim("f", "j") == ("waits", None)
    assert twins.settle("e", None) == [("f", None)]  # the first of "j" was cancelled: f decodes itself
    assert twins.answered == 2 and twins.settle("f", _response(3)) == []  # f was no first
    assert twins.claim("h", "j") == ("decode", None)
    twins.settle("h", _response(4))  # kept: "j" evicts "k" (recent=1)
    assert twins.claim("g", "k") == ("decode", None) and twins.claim("i", "j")[0] == "answered"


def _adapter(model, rank: int, b_scale: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    adapter = {}
    for path, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in ("q_proj", "v_proj", "down_proj"):
            adapter[path] = (torch.randn(rank, m.in_features, generator=g),
                             torch.randn(m.out_features, rank, generator=g) * b_scale, 2.0 / rank)
    return adapter


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """The tiny model's sampler workers of a fusing service and of today's (``fuse_runs=False``),
    each holding two fresh adapters (``B`` zero) and a trained one."""
    import rlkit

    workers = {}
    for fuse in (True, False):
        svc = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path_factory.mktemp("ckpt"), fuse_runs=fuse)
        w = svc.create_sampling_client(base_model="tiny")._runtime.sampler
        for key, b_scale, seed in (("fresh-a", 0.0, 1), ("fresh-b", 0.0, 2), ("trained", 0.5, 3)):
            w.pin(key, _adapter(w.sampler.model, 4, b_scale, seed))
        workers[fuse] = (svc, w)
    yield {fuse: w for fuse, (_, w) in workers.items()}
    for svc, _ in workers.values():
        svc.close()


def _job(key, payload):
    from rlkit.backends.local.workers import make_job

    return make_job(key, "sample", payload, "sample")


def _alone(worker, params, key=""):
    """What ``key`` samples alone, decoded for sure (a listener: no twin answers it)."""
    return worker.submit(_job(key, _request(params, on_token=lambda i, t: None))).result(timeout=120)


def _tokens(response):
    return [s.tokens for s in response.sequences]


def test_two_runs_fresh_adapters_share_one_decode_of_the_base_and_get_its_tokens(services):
    worker = services[True]
    base = {"seeded": _alone(worker, SEEDED), "greedy": _alone(worker, GREEDY)}
    assert _tokens(_alone(worker, SEEDED, "trained")) != _tokens(base["seeded"])  # the trained adapter differs
    decodes, answered = worker.decodes, worker.twins.answered
    jobs = [_job(key, _request(p)) for p in (SEEDED, GREEDY) for key in ("fresh-a", "fresh-b")]
    with worker._ready:  # queued together: the worker's next batch finds them all
        futures = [worker.submit(j) for j in jobs]
    got = [f.result(timeout=120) for f in futures]
    assert worker.decodes == decodes + 1 and worker.twins.answered == answered + 2
    for response, kind in zip(got, ("seeded", "seeded", "greedy", "greedy")):
        assert _tokens(response) == _tokens(base[kind])
        assert [s.logprobs for s in response.sequences] == [s.logprobs for s in got[0 if kind == "seeded" else 2].sequences]
    assert got[0] is not got[1]  # each its own copy
    later = worker.submit(_job("fresh-b", _request(SEEDED))).result(timeout=120)  # its twin finished: a kept answer
    assert worker.decodes == decodes + 1 and worker.twins.answered == answered + 3 and _tokens(later) == _tokens(base["seeded"])


def test_requests_that_are_not_twins_still_decode(services):
    worker = services[True]
    for params, keys in ((UNSEEDED, ("fresh-a", "fresh-b")), (SEEDED, ("trained", "trained"))):
        decodes, answered = worker.decodes, worker.twins.answered
        for key in keys:
            worker.submit(_job(key, _request(params))).result(timeout=120)
        assert worker.decodes == decodes + 2 and worker.twins.answered == answered


def test_a_cancelled_first_leaves_its_twin_to_decode_itself(services):
    worker = services[True]
    prompt = (4, 5, 6, 7)
    want = _tokens(worker.submit(_job("", _request(SEEDED, prompt, on_token=lambda i, t: None))).result(timeout=120))
    first, twin = _job("fresh-a", _request(SEEDED, prompt)), _job("fresh-b", _request(SEEDED, prompt))
    cancelled, answered, waiting = threading.Event(), worker.twins.answered, []

    def cancel_the_first(i, token):  # a batchmate's listener: runs on the sampler thread mid-decode
        if not cancelled.is_set():
            cancelled.set()
            waiting.append(worker.twins.answered - answered)  # 1: the twin waits on the first
            first.future.cancel()

    other = _job("trained", _request(GREEDY, prompt, on_token=cancel_the_first))
    with worker._ready:
        futures = [worker.submit(j) for j in (first, twin, other)]
    assert _tokens(futures[1].result(timeout=120)) == want
    assert cancelled.is_set() and futures[0].cancel_requested and futures[2].result(timeout=120)
    assert waiting == [1] and worker.twins.answered == answered  # it waited, then decoded itself
    with pytest.raises(concurrent.futures.CancelledError):
        futures[0].result(timeout=120)


def test_without_fuse_runs_fresh_adapters_merge_and_nothing_is_shared(services):
    worker = services[False]
    for key in ("fresh-a", "fresh-b"):
        worker.submit(_job(key, _request(SEEDED))).result(timeout=120)
    assert worker.twins.answered == 0 and worker.sampler.weights_key == "fresh-b"
