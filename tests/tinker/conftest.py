"""One Tinker-compatible server per test module, driven by the real ``tinker`` SDK."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")


@pytest.fixture(scope="module")
def tinker_server(tmp_path_factory):
    from rlkit.backends.tinker.server import TinkerServer

    server = TinkerServer(
        state_dir=str(tmp_path_factory.mktemp("tinker-state")), fwdbwd_max_chunk_len=2, long_poll_s=2.0
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tinker_service(tinker_server):
    import tinker

    service = tinker.ServiceClient(base_url=tinker_server.url, api_key="tml-test")
    yield service
    service.close("success").result()
