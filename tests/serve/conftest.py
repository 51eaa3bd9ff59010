"""Fixtures of the serving tests: one in-process ``rlkit serve`` app on the tiny model."""

from __future__ import annotations

import pytest

API_KEY = "sk-rlkit-test-key"


@pytest.fixture(scope="session")
def api_key():
    return API_KEY


@pytest.fixture(scope="session")
def serve_service(tmp_path_factory):
    import rlkit

    svc = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path_factory.mktemp("serve-ckpt"))
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def tiny_source(serve_service):
    from rlkit.serve import FixedModel

    return FixedModel(serve_service.create_sampling_client(base_model="tiny"), name="tiny", base_model="tiny")


@pytest.fixture(scope="session")
def tiny_server(tiny_source):
    """``rlkit serve`` on the tiny model with bearer auth, a 64 KiB body limit and max_tokens <= 256."""
    from rlkit.serve import Limits, create_app, start_server

    limits = Limits(max_tokens=256, default_max_tokens=32, max_n=8, max_request_bytes=64 * 1024)
    server = start_server(create_app(tiny_source, api_key=API_KEY, limits=limits))
    yield server
    server.stop()


@pytest.fixture()
def client(tiny_server):
    import openai

    with openai.OpenAI(base_url=tiny_server.base_url, api_key=API_KEY, max_retries=0, timeout=60) as c:
        yield c
