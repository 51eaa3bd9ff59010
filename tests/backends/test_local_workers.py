"""Work submitted to a closed engine thread ends at once (``rlkit/backends/local/workers.py``):
queued behind the stop marker it would never run, and a caller waiting on its future (a shared
run's thread after Ctrl-C closed the service) would wait forever."""

from __future__ import annotations

import pytest

from rlkit.backends.local.workers import OrderedWorker, SamplerWorker, make_job
from rlkit.errors import ClientStoppedError


def test_work_after_close_fails_at_once_and_work_before_it_runs():
    worker = OrderedWorker("rlkit-test")
    before = worker.submit(lambda: 41 + 1, operation="before")
    worker.close()
    assert before.result(timeout=5) == 42  # close() lets queued work finish
    after = worker.submit(lambda: 1, operation="forward_backward")
    with pytest.raises(ClientStoppedError, match="forward_backward: the local engine was closed"):
        after.result(timeout=5)


def test_a_sample_after_the_sampler_closed_fails_at_once():
    sampler = SamplerWorker(sampler=None, load_adapter=lambda key: None)
    sampler.close()
    future = sampler.submit(make_job("", "sample", object(), "sample"))
    with pytest.raises(ClientStoppedError, match="sample: the local engine was closed"):
        future.result(timeout=5)
