"""Injected throttling, 5xx errors and lost responses: the SDK's retries plus the service's
clientToken deduplication complete every operation once — the results equal a fault-free run's
and the emulator executed each sequence number exactly once. An expired session surfaces as one
clear error."""

import math

import pytest

from sm_support import require_sdk, running_emulator, session_statuses, settled_status

require_sdk()

import rlkit  # noqa: E402
from helpers import sft_datum  # noqa: E402
from rlkit.backends.sagemaker.sampling import SessionEndedError  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

STEPS = 2


def short_loop(svc):
    """fb + optim + publish + seeded sample per step; returns what a loop would log."""
    trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
    tok = trainer.get_tokenizer()
    batch = [sft_datum(tok.encode(t), prompt_len=2) for t in ("one two three four", "five six seven eight nine")]
    prompt = tok.encode("count:")
    log = []
    for step in range(STEPS):
        fb = trainer.forward_backward(batch)
        opt = trainer.optim_step(rlkit.AdamParams(learning_rate=5e-3))
        sampler = trainer.save_weights_and_get_sampling_client(f"step {step}")
        sample = sampler.sample(prompt, num_samples=2, sampling_params=rlkit.SamplingParams(max_tokens=4, temperature=1.0, seed=step))
        log.append((fb.result(timeout=120).metrics["loss:sum"], opt.result(timeout=120).metrics["grad_norm"],
                    [s.tokens for s in sample.result(timeout=120).sequences]))
    arn = trainer.save_state("end").result(timeout=120).model_package_arn
    trainer.stop()
    return trainer.name, log, arn


def test_faults_lose_nothing_and_execute_nothing_twice(tmp_path):
    with running_emulator(tmp_path / "clean") as emu:
        with rlkit.connect("sagemaker") as svc:
            _, clean, _ = short_loop(svc)
        assert emu.state.stats["duplicate_submits"] == 0

    faults = dict(throttle_rate=0.15, error_rate=0.1, lost_response_rate=0.3, fault_seed=3)
    with running_emulator(tmp_path / "faulty", **faults) as emu:
        with rlkit.connect("sagemaker") as svc:
            name, faulty, _ = short_loop(svc)
        stats = emu.state.stats
        facts = emu.state.summary()["sessions"][name]
        statuses = session_statuses(emu)

    assert stats["throttled"] > 0 and stats["server_errors"] > 0 and stats["lost_responses"] > 0
    assert stats["duplicate_submits"] > 0, "a lost ExecuteTrainingOperation response must have been retried"
    assert stats["training_ops_failed"] == 0
    # per step fb, optim, saveWeights (publish); then saveState. A forward_backward's logprobs are
    # scored only when asked (return_logprobs=True), so no save of its own is needed for them
    n_ops = STEPS * 3 + 1
    assert facts["executed_seqs"] == list(range(1, n_ops + 1))
    assert facts["training_ops"] == n_ops  # one operation per sequence number, whatever the retries
    for (l1, g1, s1), (l2, g2, s2) in zip(clean, faulty):
        assert math.isclose(l1, l2, rel_tol=1e-6) and math.isclose(g1, g2, rel_tol=1e-6) and s1 == s2
    assert statuses[name] in ("Stopping", "Stopped")


def test_an_expired_session_is_one_clear_error(tmp_path):
    with running_emulator(tmp_path, expire_after_ops=2) as emu:  # fb + optim, then it expires
        svc = rlkit.connect("sagemaker")
        trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
        tok = trainer.get_tokenizer()
        batch = [sft_datum(tok.encode("one two three"), prompt_len=1)]
        trainer.forward_backward(batch).result(timeout=60)
        trainer.optim_step().result(timeout=60)
        with pytest.raises(SessionEndedError, match=r"is (Stopping|Expired).*resume"):
            trainer.forward_backward(batch).result(timeout=60)
        trainer.stop()  # a session the service ended counts as stopped
        svc.close()
        assert settled_status(emu, trainer.name) == "Expired"
