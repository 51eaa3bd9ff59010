"""The servers' newer command-line flags reach their options (in-process: the server class is replaced by a
recorder, so nothing binds or loads); bad values are one-line ConfigErrors before anything starts."""

import pytest

from rlkit.errors import ConfigError


class Started(Exception):
    """Raised by the recorder instead of binding a socket."""


def recorder(seen):
    class Recorder:
        def __init__(self, options, **_):
            seen.append(options)

        def bind(self, host, port):
            raise Started

    return Recorder


def test_tinker_server_flags_reach_its_options(monkeypatch):
    import rlkit.backends.tinker.server as server
    from rlkit.backends.tinker.server.cli import serve_tinker

    seen = []
    monkeypatch.setattr(server, "TinkerServer", recorder(seen))
    monkeypatch.delenv("RLKIT_TINKER_API_KEY", raising=False)
    with pytest.raises(Started):
        serve_tinker(["--api-key", "tml-a", "--api-key", "tml-b", "--request-deadline-s", "30", "--max-num-samples", "16"])
    assert (seen[0].api_key, seen[0].api_keys, seen[0].request_deadline_s, seen[0].max_num_samples) == ("tml-a", ("tml-b",), 30.0, 16)
    monkeypatch.setenv("RLKIT_TINKER_API_KEY", "tml-x, tml-y")
    with pytest.raises(Started):
        serve_tinker([])
    assert (seen[1].api_key, seen[1].api_keys, seen[1].request_deadline_s) == ("tml-x", ("tml-y",), 900.0)
    with pytest.raises(ConfigError, match="--request-deadline-s"):
        serve_tinker(["--request-deadline-s", "-1"])
    assert len(seen) == 2


def test_emulator_flags_reach_its_options(monkeypatch):
    import rlkit.backends.sagemaker.emulator as emulator
    from rlkit.backends.sagemaker.cli import emulate_command

    seen = []
    monkeypatch.setattr(emulator, "Emulator", recorder(seen))
    monkeypatch.delenv("RLKIT_EMULATOR_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(Started):
        emulate_command(["sagemaker", "--secret-access-key", "s3cret", "--ended-session-ttl", "5"])
    assert (seen[0].secret_access_key, seen[0].ended_session_ttl_s) == ("s3cret", 5.0)
    monkeypatch.setenv("RLKIT_EMULATOR_SECRET_ACCESS_KEY", "from-env")
    with pytest.raises(Started):
        emulate_command(["sagemaker"])
    assert seen[1].secret_access_key == "from-env" and seen[1].ended_session_ttl_s == 3600.0
