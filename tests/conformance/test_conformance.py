"""``rlkit conformance``: the contract's suite passes on the three shipped engines (the local engine,
the SageMaker emulator through the sagemaker-train SDK, rlkit's Tinker server through the tinker
SDK, each with the same-script parity against local), and names the loss and the difference on a
server whose loss maths are off."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rlkit.cli import main

os.environ.setdefault("TINKER_TELEMETRY", "0")


def last_line(capsys):
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_local_engine_conforms(capsys):
    assert main(["conformance", "local"]) == 0
    assert last_line(capsys).startswith("13 pass, 0 refused, 0 wrong, 0 error")


@pytest.fixture(scope="module")
def tinker_server(tmp_path_factory):
    pytest.importorskip("tinker")
    from rlkit.backends.tinker.server import TinkerServer

    server = TinkerServer(state_dir=str(tmp_path_factory.mktemp("tinker-state"))).start()
    yield server
    server.stop()


def test_rlkit_tinker_server_conforms_with_parity(tinker_server, capsys):
    assert main(["conformance", "tinker", "--base-url", tinker_server.url, "--api-key", "tml-test"]) == 0
    out = capsys.readouterr().out
    assert "parity/same script as the local engine" in out and "fixed at 32" in out
    assert out.strip().splitlines()[-1].startswith("15 pass, 0 refused, 0 wrong, 0 error")


def test_sagemaker_emulator_conforms_with_parity(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sagemaker"))
    from sm_support import require_sdk, running_emulator

    require_sdk()
    with running_emulator(tmp_path / "emulator") as emu:
        assert main(["conformance", "sagemaker", "--endpoint", emu.url]) == 0
    out = capsys.readouterr().out
    assert "parity/same script as the local engine" in out and "grad norm x2.00000" in out
    assert out.strip().splitlines()[-1].startswith("14 pass, 0 refused, 0 wrong, 0 error")


def test_a_server_whose_ppo_is_off_by_10_percent_is_named_wrong(tinker_server, monkeypatch):
    """The server's built-in ppo computes 1.1x the loss (its gradient 1.1x): the suite reports
    loss/ppo wrong with the measured difference, every other loss passes."""
    import rlkit
    import rlkit.losses.builtin as builtin
    from rlkit.conformance import failed, run_suite

    honest = builtin.builtin_loss

    def off_by_ten_percent(name, config=None):  # only the server looks the built-in up here
        loss = honest(name, config)
        return 1.1 * loss if name == "ppo" else loss

    monkeypatch.setattr(builtin, "builtin_loss", off_by_ten_percent)
    service = rlkit.connect("tinker", base_url=tinker_server.url, api_key="tml-test")
    try:
        results = {r.check: r for r in run_suite(service, only=("cross-entropy", "built-in"))}
    finally:
        service.close()
    assert results["loss/ppo"].status == "wrong" and "grad norm rel diff 1.0e-01" in results["loss/ppo"].detail
    assert [results[k].status for k in ("loss/cross_entropy", "loss/importance_sampling", "loss/cispo")] == ["pass"] * 3
    assert failed(list(results.values()))


def test_not_a_service_is_one_line_and_exit_2(capsys):
    assert main(["conformance", "tinker"]) == 2 or os.environ.get("TINKER_BASE_URL")
    assert "pass --base-url" in capsys.readouterr().err
