"""``precision="auto"``: the decision from probe results, the per-machine cache, CUDA's hardware
flags, and what the service reports. The probe itself is replaced by fixed numbers here (no
timing assertions); the real probe runs once at the end to show it returns usable numbers."""

import json
import logging

import pytest
import torch

from rlkit.backends.local import precision as P
from rlkit.errors import InvalidInputError


@pytest.mark.parametrize(
    "fp32, bf16, expected",
    [
        (314.0, 165.0, "fp32"),  # AVX-512 BF16 without AMX (issue 18's machine)
        (210.0, 880.0, "bf16"),  # AMX
        (100.0, 150.0, "bf16"),  # exactly BF16_MIN_SPEEDUP
        (100.0, 149.0, "fp32"),
        (0.0, 10.0, "fp32"),  # a broken probe never picks bf16
    ],
)
def test_decision_from_peaks(fp32, bf16, expected):
    choice = P.decide_from_peaks(fp32, bf16)
    assert choice.precision == expected
    assert f"{fp32:.0f} GFLOP/s fp32, {bf16:.0f} bf16" in choice.reason


class FakeProbe:
    def __init__(self, fp32, bf16, aten=100.0, onednn=100.0):
        self.calls = 0
        self.peaks = {"fp32_gflops": fp32, "bf16_gflops": bf16, "fp32_linear_aten_gflops": aten, "fp32_linear_onednn_gflops": onednn}

    def __call__(self):
        self.calls += 1
        return dict(self.peaks)


def test_probe_runs_once_per_machine_key_and_is_cached(tmp_path):
    path = tmp_path / "precision.json"
    probe = FakeProbe(200.0, 900.0)
    first = P.cpu_choice(probe=probe, path=path, key="machine-a")
    assert first.precision == "bf16" and "probed now" in first.reason and probe.calls == 1
    cached = json.loads(path.read_text())
    assert cached["machine-a"]["fp32_gflops"] == 200.0 and cached["machine-a"]["bf16_gflops"] == 900.0
    again = P.cpu_choice(probe=probe, path=path, key="machine-a")
    assert again.precision == "bf16" and "cached in" in again.reason and probe.calls == 1
    # another machine (or torch version) is probed again; both entries are kept
    other = P.cpu_choice(probe=FakeProbe(300.0, 160.0), path=path, key="machine-b")
    assert other.precision == "fp32"
    assert set(json.loads(path.read_text())) == {"machine-a", "machine-b"}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"k": {"fp32_gflops": 1, "bf16_gflops": 2}}'])
def test_unreadable_cache_is_probed_again_and_rewritten(tmp_path, content):
    path = tmp_path / "precision.json"
    path.write_text(content)
    probe = FakeProbe(100.0, 400.0)
    assert P.cpu_choice(probe=probe, path=path, key="k").precision == "bf16" and probe.calls == 1
    assert json.loads(path.read_text())["k"]["bf16_gflops"] == 400.0


@pytest.mark.parametrize("aten, onednn, expected", [(80.0, 160.0, "onednn_linear"), (100.0, 105.0, "linear"), (100.0, 0.0, "linear")])
def test_fp32_linear_kernel_from_the_same_probe(tmp_path, aten, onednn, expected):
    probe = FakeProbe(100.0, 100.0, aten=aten, onednn=onednn)
    kernel, reason = P.fp32_linear(probe=probe, path=tmp_path / "p.json", key="k")
    assert kernel.__name__ == expected and f"{aten:.0f} GFLOP/s F.linear, {onednn:.0f} oneDNN" in reason
    P.cpu_choice(probe=probe, path=tmp_path / "p.json", key="k")
    assert probe.calls == 1  # one probe answers both questions


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_onednn_linear_is_linear():
    x, w, b = torch.randn(5, 16), torch.randn(7, 16), torch.randn(7)
    assert torch.allclose(P.onednn_linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5)


def test_unwritable_cache_still_decides(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    probe = FakeProbe(100.0, 90.0)
    assert P.cpu_choice(probe=probe, path=blocker / "precision.json", key="k").precision == "fp32"


def test_machine_key_names_cpu_and_torch():
    key = P.machine_key()
    assert torch.__version__ in key and key.count("|") == 3


def test_explicit_values_are_kept_without_a_probe(tmp_path):
    probe = FakeProbe(1.0, 1000.0)
    for value in ("fp32", "bf16"):
        choice = P.resolve_precision(value, torch.device("cpu"), probe=probe, path=tmp_path / "p.json")
        assert choice.precision == value and choice.reason == "requested"
    assert probe.calls == 0 and not (tmp_path / "p.json").exists()
    with pytest.raises(InvalidInputError, match=r"precision='fp16': expected one of \['auto', 'fp32', 'bf16'\]"):
        P.resolve_precision("fp16", torch.device("cpu"))


def test_auto_is_logged_once(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(P, "_logged", set())
    with caplog.at_level(logging.INFO, logger="rlkit.backends.local"):
        for _ in range(3):
            choice = P.resolve_precision("auto", torch.device("cpu"), probe=FakeProbe(100.0, 300.0), path=tmp_path / "p.json", key="k")
    notes = [r.getMessage() for r in caplog.records if "precision=auto" in r.getMessage()]
    assert choice.precision == "bf16" and len(notes) == 1
    assert notes[0].startswith("precision=auto: bf16 on cpu (one-thread matmul 100 GFLOP/s fp32, 300 bf16")


@pytest.mark.parametrize("capability, expected", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp32")])
def test_cuda_is_decided_by_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    choice = P.resolve_precision("auto", torch.device("cuda", 0), probe=FakeProbe(1.0, 1.0))
    assert choice.precision == expected and f"compute capability {capability[0]}.{capability[1]}" in choice.reason


def test_service_reports_the_choice(tmp_path, monkeypatch):
    import rlkit

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    key = P.machine_key()
    (tmp_path / "precision.json").write_text(json.dumps({key: FakeProbe(300.0, 150.0).peaks}))
    svc = rlkit.connect("local", checkpoint_dir=tmp_path / "ckpt")  # default precision="auto"
    try:
        assert svc.precision == "fp32" and "300 GFLOP/s fp32, 150 bf16" in svc.precision_reason
    finally:
        svc.close()
    svc = rlkit.connect("local", precision="bf16", checkpoint_dir=tmp_path / "ckpt")
    try:
        assert svc.precision == "bf16" and svc.precision_reason == "requested"
    finally:
        svc.close()


def test_the_real_probe_measures_both_dtypes():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        peaks = P.probe_cpu()
        assert torch.get_num_threads() == 2  # restored after the one-thread probe
    finally:
        torch.set_num_threads(before)
    assert set(peaks) == set(P.PROBE_KEYS) and peaks["fp32_gflops"] > 0 and peaks["bf16_gflops"] > 0
