"""One request's fault inside a shared decode batch fails that request only: its batchmates are
decoded again alone and finish with the tokens they would have had alone (same seeds)."""

from __future__ import annotations

import pytest

from rlkit.types import SamplingParams


def test_a_request_that_fails_inside_a_shared_decode_fails_alone(service, monkeypatch):
    from rlkit.backends.local.sampler import SampleRequest, Sampler
    from rlkit.backends.local.workers import make_job

    client = service.create_sampling_client(base_model="tiny")
    worker, key = client._runtime.sampler, client.weights_key
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5)

    def good():
        return [SampleRequest([1, 2, 3], 2, params), SampleRequest([4, 5], 1, params)]

    worker.sampler.set_weights(key, worker._adapter(key))
    alone = [worker.sampler.sample([r])[0] for r in good()]  # each request decoded by itself

    poison = SampleRequest([7, 8, 9], 1, params)
    record = Sampler._record

    def faulty(self, flight, i, token, logprob):  # an injected per-row fault at the poison's 3rd token
        if flight.request is poison and len(flight.tokens[i]) >= 2:
            raise RuntimeError("injected per-row fault")
        return record(self, flight, i, token, logprob)

    monkeypatch.setattr(Sampler, "_record", faulty)
    heard = []
    first, second = good()
    second.on_token = lambda i, t: heard.append(t)
    jobs = [make_job(key, "sample", r, "sample") for r in (first, poison, second)]
    worker._run_group(key, jobs)  # the worker's own batching path: one shared decode

    with pytest.raises(RuntimeError, match="injected per-row fault"):
        jobs[1].future.result(timeout=0)
    for job, want in zip((jobs[0], jobs[2]), alone):
        got = job.future.result(timeout=0)
        assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
    assert heard == list(alone[1].sequences[0].tokens)  # a listener hears each token once
