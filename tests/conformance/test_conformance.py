"""``rlkit conformance``: the contract's suite passes on the three shipped engines (the local engine,
the SageMaker emulator through the sagemaker-train SDK, rlkit's Tinker server through the tinker
SDK, each with the same-script parity against local), and names the check and the difference on a
server that breaks one promise of docs/tinker.md: loss maths off, sampled logprobs that ignore the
temperature, other ppo/cispo defaults when no config is sent, a ppo/cispo clip threshold 0.05 off
(its default or the sent value), weight decay applied when told 0."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rlkit.cli import main

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

os.environ.setdefault("TINKER_TELEMETRY", "0")


def last_line(capsys):
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_local_engine_conforms(capsys):
    assert main(["conformance", "local"]) == 0
    assert last_line(capsys).startswith("19 pass, 0 refused, 0 wrong, 0 error")


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
    assert out.strip().splitlines()[-1].startswith("20 pass, 1 refused, 0 wrong, 0 error")


def test_sagemaker_emulator_conforms_with_parity(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sagemaker"))
    from sm_support import require_sdk, running_emulator

    require_sdk()
    with running_emulator(tmp_path / "emulator") as emu:
        assert main(["conformance", "sagemaker", "--endpoint", emu.url]) == 0
    out = capsys.readouterr().out
    assert "parity/same script as the local engine" in out and "grad norm x2.00000" in out
    assert out.strip().splitlines()[-1].startswith("19 pass, 1 refused, 0 wrong, 0 error")


def test_a_server_whose_ppo_is_off_by_10_percent_is_named_wrong(tinker_server, monkeypatch):
    """The server's built-in ppo computes 1.1x the loss (its gradient 1.1x): the suite reports
    loss/ppo wrong with the measured difference, every other loss passes."""
    import rlkit
    from rlkit.backends.tinker.server import ops
    from rlkit.conformance import failed, run_suite

    honest = ops.tinker_loss

    def off_by_ten_percent(loss_fn, config, data):  # the server's Tinker loss_fn -> rlkit loss
        loss, data = honest(loss_fn, config, data)
        return (1.1 * loss if loss_fn == "ppo" else loss), data

    monkeypatch.setattr(ops, "tinker_loss", off_by_ten_percent)
    service = rlkit.connect("tinker", base_url=tinker_server.url, api_key="tml-test")
    try:
        results = {r.check: r for r in run_suite(service, only=("cross-entropy", "built-in"))}
    finally:
        service.close()
    assert results["loss/ppo"].status == "wrong" and "grad norm rel diff 1.0e-01" in results["loss/ppo"].detail
    assert [results[k].status for k in ("loss/cross_entropy", "loss/importance_sampling", "loss/cispo")] == ["pass"] * 3
    assert failed(list(results.values()))


def _ignores_the_temperature(monkeypatch):
    """The server's sampler draws at T but reports each token's logprob under softmax(logits), T = 1."""
    import torch

    from rlkit.backends.local.sampler import Sampler
    from rlkit.backends.local.workers import SamplerWorker

    honest = Sampler._pick

    def pick(self, logits, row_requests, allowed=None):
        tokens, _ = honest(self, logits, row_requests, allowed)
        return tokens, torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    monkeypatch.setattr(Sampler, "_pick", pick)
    # the server keeps recent answers to deterministic requests on the base (twins.py): an answer
    # computed before this mutation would hide it, so this mutant decodes every request itself
    monkeypatch.setattr(SamplerWorker, "_claim", lambda self, job: True)


def _other_clip_defaults(monkeypatch):
    """The server's ppo / cispo clip at 0.9 / 1.1 when the client sends no loss_fn_config."""
    from rlkit.backends.tinker.server import ops

    honest = ops.tinker_loss

    def tinker_loss(loss_fn, config, data):
        if not config and loss_fn in ("ppo", "cispo"):
            config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
        return honest(loss_fn, config, data)

    monkeypatch.setattr(ops, "tinker_loss", tinker_loss)


def _decays_when_told_zero(monkeypatch):
    """The server's AdamW reads weight decay 0 as 'unset' and applies 0.01 (``value or default``)."""
    from rlkit.backends.tinker.server import ops

    honest = ops.adam_params

    def adam_params(raw):
        params = honest(raw)
        return params.model_copy(update={"weight_decay": params.weight_decay or 0.01})

    monkeypatch.setattr(ops, "adam_params", adam_params)


@pytest.mark.parametrize("mutant, only, caught, still_pass", [
    (_ignores_the_temperature, "temperature", ["sample/logprobs at temperature 0.7 scale by 1/T"], []),
    (_other_clip_defaults, "defaults", ["loss/ppo with no loss_fn_config", "loss/cispo with no loss_fn_config"], []),
    (_decays_when_told_zero, "weight decay", ["optim/weight decay 0 leaves the weights alone"],
     ["optim/weight decay 1 shrinks the adapter by (1 - lr*wd)^2"]),
], ids=["sampled logprobs ignore the temperature", "ppo/cispo defaults differ", "weight decay applied when told 0"])
def test_a_server_that_breaks_a_documented_promise_fails_that_check(tinker_server, monkeypatch, mutant, only, caught, still_pass):
    """Each mutant of rlkit's Tinker server breaks one promise of docs/tinker.md and passes every
    check that existed before these three; the suite names exactly the check it breaks (the
    unmutated server passes them all: test_rlkit_tinker_server_conforms_with_parity)."""
    import rlkit
    from rlkit.conformance import failed, run_suite

    mutant(monkeypatch)
    service = rlkit.connect("tinker", base_url=tinker_server.url, api_key="tml-test")
    try:
        results = {r.check: r for r in run_suite(service, only=(only,))}
    finally:
        service.close()
    assert [results[k].status for k in caught] == ["wrong"] * len(caught), results
    assert [results[k].status for k in still_pass] == ["pass"] * len(still_pass), results
    assert failed(list(results.values()))


def test_the_rl_data_put_a_ratio_on_each_side_of_every_clip_threshold_checked():
    """Hand-checkable: for ppo's and cispo's clip thresholds, at the documented default and at the
    configured value, some weighted token's ratio p/q (computed as the losses compute it) lies
    strictly between the value and value - 0.05, and one between the value and value + 0.05 — with
    a positive advantage for a high threshold and a negative one for a low threshold (where PPO's
    clip bites; CISPO's bites at either sign). So a threshold off by 0.05 changes some gradient."""
    import torch

    from rlkit.conformance.checks import CLIP, DEFAULT_CLIP, NEIGHBOUR, rl_base, rl_data
    from rlkit.losses.base import datum_input
    from rlkit.losses.builtin import BUILTIN_LOSSES
    from rlkit.losses.offpolicy import importance_ratio

    assert NEIGHBOUR == 0.05
    base = rl_base(vocab=100)
    trainer = [torch.linspace(-3.0, -0.5, d.model_input.length) for d in base]  # any trainer logprobs
    weighted = []  # (ratio, advantage) at every weighted position
    for d, lp in zip(rl_data(base, trainer), trainer):
        ratio = importance_ratio(lp, torch.tensor(datum_input(d, "logprobs").tolist(), dtype=lp.dtype))
        w, adv = datum_input(d, "weights"), datum_input(d, "advantages")
        weighted += [(float(r), float(a)) for r, a, x in zip(ratio, adv, w) if x != 0]
    assert {a > 0 for _, a in weighted} == {True, False}
    assert any(r < 0.7 for r, _ in weighted) and any(r > 1.3 for r, _ in weighted)  # outside every bound
    assert any(0.9 < r < 1.1 for r, _ in weighted)  # inside every bound
    for name in ("ppo", "cispo"):
        assert set(BUILTIN_LOSSES[name][1]) == {"clip_low_threshold", "clip_high_threshold"}
        for key in ("clip_low_threshold", "clip_high_threshold"):
            bites = (lambda a: a > 0) if key == "clip_high_threshold" else (lambda a: a < 0)
            for value in (DEFAULT_CLIP[key], CLIP[key]):
                for lo, hi in ((value - NEIGHBOUR, value), (value, value + NEIGHBOUR)):
                    found = [(r, a) for r, a in weighted if lo < r < hi and (name == "cispo" or bites(a))]
                    assert found, (name, key, value, lo, hi, weighted)


def _clip_off(loss: str, key: str, delta: float, mode: str):
    """The server's ``loss`` uses ``key`` off by ``delta``: at the documented default when the client
    sends no loss_fn_config (``mode == "default"``), or at the sent value when it sends one."""
    def mutant(monkeypatch):
        from rlkit.backends.tinker.server import ops
        from rlkit.conformance.checks import DEFAULT_CLIP

        honest = ops.tinker_loss

        def tinker_loss(loss_fn, config, data):
            if loss_fn == loss and mode == "default" and not config:
                config = {key: DEFAULT_CLIP[key] + delta}
            elif loss_fn == loss and mode == "configured" and config:
                config = {**config, key: config[key] + delta}
            return honest(loss_fn, config, data)

        monkeypatch.setattr(ops, "tinker_loss", tinker_loss)
    return mutant


@pytest.fixture(scope="module")
def tinker_context(tinker_server):
    """One training client on rlkit's Tinker server, set up as run_suite sets up its own (every
    check restores the state it starts from, so the cases below share it)."""
    import rlkit
    from rlkit.conformance.checks import Context, choose_optimizer

    service = rlkit.connect("tinker", base_url=tinker_server.url, api_key="tml-test")
    trainer = service.create_lora_training_client("tiny", rank=4, seed=0)
    ctx = Context(service, trainer, "tiny", 4, int(len(trainer.get_tokenizer())), lambda message: None)
    choose_optimizer(ctx)
    yield ctx
    trainer.stop()
    service.close()


@pytest.mark.parametrize("mode", ["default", "configured"])
@pytest.mark.parametrize("delta", [0.05, -0.05])
@pytest.mark.parametrize("key", ["clip_low_threshold", "clip_high_threshold"])
@pytest.mark.parametrize("loss", ["ppo", "cispo"])
def test_a_clip_threshold_off_by_005_fails_exactly_its_check(tinker_context, monkeypatch, loss, key, delta, mode):
    """A server whose ppo / cispo applies one clip threshold 0.05 off — its default (no config
    sent), or the configured value — fails exactly that loss's check in that mode, and the other
    built-in's check in that mode passes. These are the checks of run_suite's ``built-in`` /
    ``defaults`` steps that the mutant can touch (it changes neither importance_sampling nor the
    other mode's calls), run on one shared client: run_suite per case took 82 s for the 16 cases on
    2 shared cores, this 21-62 s (62 s beside a benchmark using a core). The unmutated server passes them all:
    test_rlkit_tinker_server_conforms_with_parity."""
    from rlkit.conformance.checks import check_builtin

    _clip_off(loss, key, delta, mode)(monkeypatch)
    checked = (check_builtin(tinker_context, name, defaults=mode == "default") for name in ("ppo", "cispo"))
    results = {r.check: r for r in checked}
    caught = f"loss/{loss} with no loss_fn_config" if mode == "default" else f"loss/{loss}"
    assert results[caught].status == "wrong", results
    others = {k: r.status for k, r in results.items() if k != caught}
    assert len(others) == 1 and set(others.values()) == {"pass"}, results


def test_not_a_service_is_one_line_and_exit_2(capsys):
    assert main(["conformance", "tinker"]) == 2 or os.environ.get("TINKER_BASE_URL")
    assert "pass --base-url" in capsys.readouterr().err
