"""An AdamW step that would make the weights non-finite is rolled back at any learning rate: a
cheap bound decides when the snapshot is needed, so a small learning rate with an extreme beta2/eps
(beta2 = 0, eps at the smallest float: the update after a zero gradient is m / eps = inf) is
rolled back too, and ordinary steps take no snapshot."""

from __future__ import annotations

import torch

import rlkit
from helpers import sft_datum
from rlkit.backends.local.clients import LocalServiceClient


def test_a_non_finite_step_below_lr_0_1_is_rolled_back_and_ordinary_steps_take_no_snapshot(tmp_path):
    svc = LocalServiceClient(checkpoint_dir=tmp_path)
    try:
        trainer = svc.create_lora_training_client("tiny", rank=4)
        engine = trainer._engine
        extreme = rlkit.AdamParams(learning_rate=1e-3, beta2=0.0, eps=1e-45, weight_decay=0.0)
        trainer.forward_backward([sft_datum([5, 6, 7, 8, 9])]).result()
        ordinary = rlkit.AdamParams(learning_rate=1e-3)
        assert not engine._may_overflow([p for _, p in engine.named_trainable], ordinary)  # no snapshot for it
        trainer.optim_step(extreme).result()  # finite: the first step moves each weight by at most lr
        weights = {n: p.detach().clone() for n, p in engine.named_trainable}
        moments = {n: engine.optimizer.state[p]["exp_avg"].clone() for n, p in engine.named_trainable}
        try:
            trainer.optim_step(extreme).result()  # a zero gradient now: m / (sqrt(0) + 1e-45) overflows
            raise AssertionError("the step was accepted")
        except rlkit.errors.InvalidInputError as err:
            assert "rolled back" in str(err) and "\n" not in str(err)
        for n, p in engine.named_trainable:
            assert torch.equal(p, weights[n]) and torch.equal(engine.optimizer.state[p]["exp_avg"], moments[n])
        assert engine.steps == 1
        trainer.forward_backward([sft_datum([5, 6, 7, 8, 9])]).result()
        assert trainer.optim_step(ordinary).result().metrics["step"] == 2.0  # the session trains on
    finally:
        svc.close()
