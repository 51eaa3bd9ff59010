"""``compute_logprobs`` calls queued together are scored together (:mod:`rlkit.backends.local.scoring`):
the same values as one at a time, shared prefixes computed once."""

from __future__ import annotations

import random

import pytest


@pytest.fixture(scope="module")
def sampler(service):
    client = service.create_sampling_client(base_model="tiny")
    return client, client._runtime.sampler.sampler


def sequences():
    rng = random.Random(0)
    context = [rng.randrange(3, 500) for _ in range(300)]
    shared = [context + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 40))] for _ in range(5)]  # four choices, say
    alone = [[rng.randrange(3, 500) for _ in range(rng.randrange(2, 200))] for _ in range(6)]
    return shared + alone + [context[:100] + [7], [9], context + [11]]  # a short neighbour, one token, the context + 1


def test_prefix_groups_share_the_long_prefix():
    from rlkit.backends.local.scoring import prefix_groups

    seqs = sequences()
    groups = prefix_groups(seqs)
    assert sorted(i for _, members in groups for i in members) == list(range(len(seqs)))
    shared = [(p, sorted(m)) for p, m in groups if len(m) > 1]
    assert shared == [(300, [0, 1, 2, 3, 4, 13])]  # the short neighbour sharing 100 tokens stays out


def test_batched_scores_equal_one_at_a_time(sampler):
    from rlkit.backends.local.scoring import score_many

    _, s = sampler
    seqs = sequences()
    one = [s.prompt_logprobs(x)[0] for x in seqs]
    many = score_many(s, seqs)
    assert [len(m) for m in many] == [len(x) for x in seqs] and all(m[0] is None for m in many)
    assert max(abs(a - b) for o, m in zip(one, many) for a, b in zip(o[1:], m[1:])) < 1e-5


def test_queued_compute_logprobs_are_scored_together(sampler):
    client, s = sampler
    seqs = sequences()
    futures = [client.compute_logprobs(x) for x in seqs]  # queued at once: the worker drains them as one group
    for x, f in zip(seqs, futures):
        got, alone = f.result(), s.prompt_logprobs(x)[0]
        assert got[0] is None and max((abs(a - b) for a, b in zip(got[1:], alone[1:])), default=0.0) < 1e-5
