"""LLM-as-judge reward: score parsing, retries with backoff on 429/5xx, the timeout, bounded
concurrency and the cache against a local stub; failures raise JudgeError (with their metrics)."""

import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from judge_stub import Stub  # noqa: E402

from rlkit.errors import ConfigError  # noqa: E402
from rlkit.rewards.judge import JudgeError, JudgeReward, parse_score  # noqa: E402

PROBLEM = {"question": "What is 2 + 2?", "answer": "4"}


@pytest.fixture()
def stub():
    from rlkit.serve.app import start_server

    s = Stub()
    server = start_server(s.app())
    s.base_url = server.base_url
    yield s
    server.stop()


def judge(stub, **kw):
    return JudgeReward(base_url=stub.base_url, model="stub-judge", api_key="k", backoff_s=0.01, **kw)


@pytest.mark.parametrize("text, expected", [
    ("Score: 7", 7.0), ("score = 3.5 because", 3.5), ("**Score:** 9", 9.0), ("First Score: 2, final Score: 8", 8.0),
    ("10", 10.0), ("7/10", 7.0), ("Score: 11", None), ("great answer", None), ("", None), ("Score: -1", None),
])
def test_parse_score(text, expected):
    assert parse_score(text, 0, 10) == expected


def test_score_scaled_with_tokens_and_rubric(stub):
    result = judge(stub)(" 4", PROBLEM)
    assert result.reward == pytest.approx(0.7)
    assert result.metrics["judge/score"] == 7 and result.metrics["tokens/judge_prompt"] == 11
    assert result.metrics["tokens/judge_completion"] == 3
    prompt = stub.bodies[0]["messages"][-1]["content"]
    assert "What is 2 + 2?" in prompt and "Reference answer:\n4" in prompt and " 4" in prompt
    assert stub.bodies[0]["model"] == "stub-judge" and stub.bodies[0]["temperature"] == 0.0


def test_retries_429_and_5xx_with_backoff_then_succeeds(stub):
    stub.statuses = [429, 503, 500]
    j = judge(stub, max_retries=3)
    t0 = time.perf_counter()
    assert j(" 4", PROBLEM).reward == pytest.approx(0.7)
    assert stub.requests == 4 and j.requests == 4
    assert time.perf_counter() - t0 >= 0.01 + 0.02 + 0.04  # exponential backoff between attempts


def test_retries_exhausted_is_a_judge_error_not_a_crash(stub):
    stub.statuses = [500] * 5
    with pytest.raises(JudgeError, match="after 3 attempt") as err:
        judge(stub, max_retries=2)(" 4", PROBLEM)
    assert err.value.metrics["judge/failed"] == 1.0 and stub.requests == 3


def test_a_4xx_other_than_429_is_not_retried(stub):
    stub.statuses = [400]
    with pytest.raises(JudgeError, match="BadRequestError"):
        judge(stub, max_retries=3)(" 4", PROBLEM)
    assert stub.requests == 1


def test_timeout_bounds_each_attempt(stub):
    stub.delay_s = 2.0
    t0 = time.perf_counter()
    with pytest.raises(JudgeError, match="Timeout"):
        judge(stub, timeout_s=0.3, max_retries=1)(" 4", PROBLEM)
    assert time.perf_counter() - t0 < 1.8 and stub.requests == 2


def test_unparseable_reply_is_a_judge_error_with_its_tokens(stub):
    stub.reply = "I like it a lot"
    with pytest.raises(JudgeError, match="no score") as err:
        judge(stub)(" 4", PROBLEM)
    assert err.value.metrics["judge/unparseable"] == 1.0 and err.value.metrics["tokens/judge_prompt"] == 11


def test_identical_requests_are_cached(stub):
    j = judge(stub)
    first, again = j(" 4", PROBLEM), j(" 4", PROBLEM)
    assert first.reward == again.reward and stub.requests == 1
    assert again.metrics["tokens/judge_prompt"] == 0  # a cached answer costs nothing
    j(" 5", PROBLEM)
    assert stub.requests == 2
    uncached = judge(stub, cache=False)
    uncached(" 4", PROBLEM), uncached(" 4", PROBLEM)
    assert stub.requests == 4


def test_concurrency_is_bounded(stub):
    stub.delay_s = 0.15
    j = judge(stub, max_concurrency=2, cache=False)
    threads = [threading.Thread(target=j, args=(f" {i}", PROBLEM)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stub.requests == 6 and stub.max_in_flight == 2


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="max_score"):
        JudgeReward(base_url="http://x/v1", model="m", min_score=5, max_score=5)
    with pytest.raises(ConfigError, match="rubric"):
        JudgeReward(base_url="http://x/v1", model="m", rubric="Grade {answr}")
