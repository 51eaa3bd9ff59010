"""Reference logprobs for a KL term: every request submitted before any is awaited (one round of
requests, not B*G sequential round trips on a remote engine), and shifted like every per-token input."""

from helpers import rl_datum
from rlkit.rl.loop import with_reference_logprobs


class RecordingReference:
    def __init__(self):
        self.events = []

    def compute_logprobs(self, tokens):
        self.events.append("submit")
        events = self.events

        class Future:
            def result(self):
                events.append("result")
                return [None] + [-0.5 * t for t in tokens[1:]]

        return Future()


def test_reference_requests_are_submitted_together_then_gathered_and_shifted():
    datums = [rl_datum([3, 4, 5], [-1.0] * 3, 1.0), rl_datum([6, 7], [-1.0] * 2, -1.0), rl_datum([8, 9, 10, 11], [-1.0] * 4, 0.5)]
    reference = RecordingReference()
    out = with_reference_logprobs(datums, reference)
    assert reference.events == ["submit"] * 3 + ["result"] * 3
    assert [d.loss_fn_inputs["ref_logprobs"].tolist() for d in out] == [[-2.0, -2.5, 0.0], [-3.5, 0.0], [-4.5, -5.0, -5.5, 0.0]]
    assert all(d.loss_fn_inputs["advantages"].tolist() == o.loss_fn_inputs["advantages"].tolist() for d, o in zip(datums, out))


def test_the_one_mismatch_metric_is_kl_q_p_by_k3_hand_computed():
    import math

    import torch

    from rlkit.losses.policy import sampler_trainer_kl

    log_ratio = torch.tensor([math.log(2.0), 0.0, math.log(0.5)])  # log p - log q
    want = ((2 - 1 - math.log(2)) + 0.0 + (0.5 - 1 - math.log(0.5))) / 3  # mean(r - 1 - log r)
    assert abs(float(sampler_trainer_kl(log_ratio)) - want) <= 1e-6 * want
