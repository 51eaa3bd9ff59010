"""The adapter reads every answer the service may give the same way: the strict one (no per-token
logprobs: scored with the session), the documented ``actor/*`` form of loss outputs (which holds
no logprobs either), and the permissive one (logprobs returned: used, nothing scored). Chunks fold
as the SDK folds them (by hand below)."""

import math

import pytest
from sm_support import require_sdk, running_emulator

require_sdk()

from helpers import sft_datum  # noqa: E402

import rlkit  # noqa: E402
from rlkit.backends.sagemaker.outputs import merge_chunks  # noqa: E402
from rlkit.types import ForwardBackwardOutput, TokenUsage  # noqa: E402


def test_chunks_fold_as_the_sdk_folds_them():
    a = ForwardBackwardOutput(
        metrics={
            "actor/pg_loss": 2.0,
            "actor/grad_norm": 5.0,
            "global_token_num": 30.0,
            "mfu": 0.1,
            "loss:sum": 4.0,
            "tokens:weighted": 10.0,
            "ppo/clip_frac:mean": 0.5,
        },
        usage=TokenUsage(train_tokens=30),
    )
    b = ForwardBackwardOutput(
        metrics={
            "actor/pg_loss": 5.0,
            "actor/grad_norm": 7.0,
            "global_token_num": 12.0,
            "mfu": 0.4,
            "loss:sum": 1.0,
            "tokens:weighted": 30.0,
            "ppo/clip_frac:mean": 0.1,
        },
        usage=TokenUsage(train_tokens=12),
    )
    out = merge_chunks([a, b], [3, 1])  # 3 datums, then 1
    assert math.isclose(out.metrics["actor/pg_loss"], (2.0 * 3 + 5.0 * 1) / 4)  # datum-weighted mean
    assert math.isclose(out.metrics["mfu"], (0.1 * 3 + 0.4 * 1) / 4)
    assert out.metrics["actor/grad_norm"] == 7.0  # the last chunk's: the whole batch's gradient
    assert out.metrics["global_token_num"] == 42.0 and out.usage.train_tokens == 42  # counts are summed
    # rlkit's own names (a permissive service) keep the local engine's rule
    assert out.metrics["loss:sum"] == 5.0 and out.metrics["tokens:weighted"] == 40.0
    assert math.isclose(out.metrics["ppo/clip_frac:mean"], (0.5 * 10 + 0.1 * 30) / 40)


@pytest.mark.parametrize("mode", ["actor", "logprobs"])
def test_each_reading_gives_the_local_engines_numbers(mode, tmp_path):
    local = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path / "local")
    with running_emulator(tmp_path / "emu", loss_outputs=mode, strict=mode != "logprobs") as emu:
        with rlkit.connect("sagemaker") as svc:
            trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
            twin = local.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
            tok = trainer.get_tokenizer()
            batch = [sft_datum(tok.encode(t), prompt_len=2) for t in ("one two three four", "five six seven")]
            out, want = trainer.forward(batch).result(timeout=60), twin.forward(batch).result()
            expected = "scoring" if mode == "actor" else "service"
            assert trainer.logprobs_source == expected
            assert out.metrics["logprobs:from_service"] == (mode == "logprobs")
            assert (out.metrics["logprobs:scored_tokens"] > 0) == (mode == "actor")
            for got, ref in zip(out.loss_fn_outputs, want.loss_fn_outputs):
                assert float((got["logprobs"].to_torch() - ref["logprobs"].to_torch()).abs().max()) < 1e-5
                if mode == "actor":  # the documented outputs stay beside the scored logprobs
                    assert "actor/pg_loss" in got
            assert math.isclose(out.metrics["loss:sum"], want.metrics["loss:sum"], rel_tol=1e-5)
            trainer.stop()
        # scoring saved one package of its own (none when the service returns logprobs), and it is
        # gone once the session that needed it stopped
        assert emu.state.stats["model_packages_registered"] == (1 if mode == "actor" else 0)
        assert emu.state.summary()["packages"] == 0
    local.close()
