"""Proxy mode: ``rlkit serve --sagemaker-session`` in front of the SageMaker emulator.

The official ``openai`` client talks to the proxy; the proxy signs ``SampleTrainingSession``
requests with SigV4 (the emulator refuses unsigned ones) and hands back OpenAI-shaped replies and
errors. The endpoint checker, run through the proxy, reports what the session's container honours.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytest.importorskip("botocore", reason="the SageMaker proxy needs botocore (pip install 'rlkit[sagemaker]')")

REGION = "us-west-2"
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    from rlkit.backends.sagemaker.emulator import Emulator

    mp = pytest.MonkeyPatch()
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        mp.delenv(key, raising=False)
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": REGION}.items():
        mp.setenv(key, value)
    emu = Emulator(state_dir=str(tmp_path_factory.mktemp("emulator")), region=REGION, cadence="fast").start()  # creation waits for Running
    try:
        yield emu
    finally:
        emu.stop()
        mp.undo()


@pytest.fixture(scope="module")
def session(emulator):
    import botocore.session

    from rlkit.backends.sagemaker.names import EMULATOR_MODELS, hub_content_arn

    control = botocore.session.get_session().create_client("sagemaker", region_name=REGION, endpoint_url=emulator.url)
    control.create_training_session(
        TrainingSessionName="serve-proxy",
        LoraConfig={"Rank": 4, "Alpha": 8},
        RoleArn="arn:aws:iam::123456789012:role/rlkit-tests",
        ModelConfig={"BaseModelArn": hub_content_arn(REGION, *EMULATOR_MODELS["tiny"])},
        OutputConfig={"S3Location": {"Path": "s3://rlkit-tests/out"}},
    )
    return "serve-proxy"


@pytest.fixture(scope="module")
def proxy_server(emulator, session):
    from rlkit.serve import create_app, start_server
    from rlkit.serve.proxy import SageMakerProxy

    source = SageMakerProxy(session, region=REGION, endpoint_url=emulator.url)
    server = start_server(create_app(source, api_key="sk-proxy"))
    yield server
    server.stop()
    source.close()


@pytest.fixture()
def client(proxy_server):
    with openai.OpenAI(base_url=proxy_server.base_url, api_key="sk-proxy", max_retries=0, timeout=60) as c:
        yield c


def test_openai_client_through_the_proxy(client, emulator):
    before = emulator.state.summary()["sessions"]["serve-proxy"]
    r = client.chat.completions.create(model="serve-proxy", messages=MESSAGES, max_tokens=8, temperature=0, seed=1)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "serve-proxy"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 8 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = client.chat.completions.create(model="serve-proxy", messages=MESSAGES, max_tokens=8, temperature=0, seed=1)
    assert again.choices[0].message.content == r.choices[0].message.content
    many = client.chat.completions.create(model="serve-proxy", messages=MESSAGES, max_tokens=4, temperature=1, n=3, seed=2)
    assert [c.index for c in many.choices] == [0, 1, 2]
    streamed = list(client.chat.completions.create(model="serve-proxy", messages=MESSAGES, max_tokens=8, temperature=0, seed=1, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == r.choices[0].message.content
    assert [m.id for m in client.models.list().data] == ["serve-proxy"]
    # the session billed the proxied tokens
    after = emulator.state.summary()["sessions"]["serve-proxy"]
    assert json.dumps(after) != json.dumps(before)


def test_errors_through_the_proxy(client, proxy_server, emulator):
    with pytest.raises(openai.BadRequestError):  # refused by the proxy's own validation, never sent
        client.chat.completions.create(model="serve-proxy", messages=[], max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MESSAGES, max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=proxy_server.base_url, api_key="nope", max_retries=0).models.list()
    # a session that does not exist: the emulator's 404 comes back OpenAI-shaped
    from rlkit.serve import create_app, start_server
    from rlkit.serve.proxy import SageMakerProxy

    missing = SageMakerProxy("no-such-session", region=REGION, endpoint_url=emulator.url)
    with start_server(create_app(missing)) as server:
        r = httpx.post(server.base_url + "/chat/completions", json={"model": "no-such-session", "messages": MESSAGES, "max_tokens": 4})
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    missing.close()


def test_checker_reports_what_the_session_honours(proxy_server):
    from rlkit.serve import check_endpoint

    report = check_endpoint(proxy_server.url, api_key="sk-proxy")
    got = {r["name"]: r["status"] for r in report["results"]}
    assert report["model"] == "serve-proxy"
    for probe in ("models", "basic", "temperature_0", "n", "seed", "errors", "auth"):
        assert got[probe] == "pass", (probe, report)
    # logprobs: the checker's verdict follows what the container actually returns
    r = httpx.post(proxy_server.base_url + "/chat/completions", headers={"Authorization": "Bearer sk-proxy"},
                   json={"model": "serve-proxy", "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 2})
    has_logprobs = bool((r.json()["choices"][0].get("logprobs") or {}).get("content"))
    assert (got["logprobs"] != "fail") == has_logprobs, report
