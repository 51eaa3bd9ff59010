"""On the SageMaker backend too, a research subclass of a built-in trains with its own compute
(through the real SDK against the emulator)."""

import sys
from pathlib import Path

import torch

from sm_support import require_sdk, running_emulator

require_sdk()

import rlkit  # noqa: E402
from rlkit.losses import PPO, run_loss  # noqa: E402
from rlkit.types import AdamParams, Datum  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "losses"))
from test_research_losses import with_extra_term  # noqa: E402
from test_run_loss import RL_KEYS, rl_data, strip  # noqa: E402


def test_subclass_trains_with_its_own_compute_on_sagemaker(tmp_path, service):
    """The same rule on the SageMaker backend, through the real SDK against the emulator: after
    one optimizer step the research subclass's weights match the local backend running the same
    subclass, and differ from the built-in's."""
    Research = with_extra_term(PPO)
    with running_emulator(tmp_path / "emulator") as _emu:
        sm = rlkit.connect("sagemaker")
        try:
            remote = sm.create_lora_training_client("tiny", rank=4, alpha=8)
            twins = {name: service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0) for name in ("research", "builtin")}
            data = strip(rl_data(twins["builtin"]), RL_KEYS)
            probe = [Datum(model_input=d.model_input, loss_fn_inputs={k: d.loss_fn_inputs[k] for k in ("target_tokens", "weights")}) for d in data]
            for client, loss in ((remote, Research()), (twins["research"], Research()), (twins["builtin"], PPO())):
                out = run_loss(client, data, loss).result(timeout=120)
                linearised = loss.native_call() is None and not client.capabilities.native_custom_losses  # local: one pass
                assert ("linearised" in out.metrics) == linearised
                client.optim_step(AdamParams(learning_rate=1e-2)).result(timeout=120)
            after = {name: torch.cat([o["logprobs"].to_torch() for o in c.forward(probe).result(timeout=120).loss_fn_outputs])
                     for name, c in (("remote", remote), *twins.items())}
            assert torch.allclose(after["remote"], after["research"], atol=1e-4)
            assert (after["remote"] - after["builtin"]).abs().max() > 1e-2
        finally:
            for t in twins.values():
                t.stop()
            sm.close()
