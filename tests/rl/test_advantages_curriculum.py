import math
import time

import pytest

from rlkit.curriculum import FixedOrder, PassRateAdaptive, ShuffledEpochs, build_curriculum
from rlkit.errors import ConfigError
from rlkit.rl.advantages import compute_advantages, dr_grpo, grpo, rloo
from rlkit.rl.schedule import AsyncSchedule, Batch


def test_grpo_by_hand():
    # rewards 1,0,0,1: mean .5, sample std sqrt(1/3)
    adv = grpo([1.0, 0.0, 0.0, 1.0], eps=0.0)
    s = math.sqrt(1 / 3)
    assert adv == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])


def test_dr_grpo_and_rloo_by_hand():
    assert dr_grpo([3.0, 1.0, 2.0]) == pytest.approx([1.0, -1.0, 0.0])
    # r_i - mean of the others
    assert rloo([3.0, 1.0, 2.0]) == pytest.approx([3 - 1.5, 1 - 2.5, 2 - 2.0])


def test_equal_rewards_give_zero_advantage():
    for est in ("grpo", "dr_grpo", "rloo"):
        assert compute_advantages([1.0, 1.0, 1.0], est) == [0.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match="advantage estimator 'ppo'"):
        compute_advantages([1.0, 0.0], "ppo")


def test_fixed_and_shuffled_orders_resume():
    f = FixedOrder(5)
    assert f.next_batch(3) == [0, 1, 2] and f.next_batch(3) == [3, 4, 0]
    a = ShuffledEpochs(10, seed=3)
    first = a.next_batch(7)
    state = a.state_dict()
    rest = a.next_batch(9)
    b = ShuffledEpochs(10, seed=3)
    b.load_state_dict(state)
    assert b.next_batch(9) == rest
    assert sorted(first + rest[:3]) == list(range(10))  # one epoch is a permutation
    assert ShuffledEpochs(10, seed=4).next_batch(10) != ShuffledEpochs(10, seed=3).next_batch(10)


def test_pass_rate_adaptive_samples_solved_problems_less():
    c = PassRateAdaptive(4, seed=0, floor=0.01, ema=1.0)
    c.update(0, [1, 1, 1, 1])  # always solved
    c.update(1, [0, 0, 0, 0])  # never solved
    c.update(2, [1, 0, 1, 0])  # informative
    counts = [0] * 4
    for _ in range(400):
        for i in c.next_batch(1):
            counts[i] += 1
    assert counts[2] > 5 * counts[0] and counts[2] > 5 * counts[1]
    restored = PassRateAdaptive(4, seed=0, floor=0.01, ema=1.0)
    restored.load_state_dict(c.state_dict())
    assert restored.next_batch(3) == c.next_batch(3)
    with pytest.raises(ConfigError, match="curriculum.name='nope'"):
        build_curriculum("nope", 3)
    with pytest.raises(ConfigError, match="empty training set"):
        FixedOrder(0)


def _fake_producer(log):
    def sample_batch(step, sampler, version):
        log.append((step, version))
        time.sleep(0.01)
        return Batch(groups=[], version=version)

    return sample_batch


def test_pacing_never_runs_more_than_k_steps_ahead():
    log = []
    sched = AsyncSchedule(_fake_producer(log), max_staleness=1, policy="pace", start_step=0)
    sched.publish("w0", 0)
    for step in range(5):
        batch = sched.next(step)
        assert step - batch.version <= 1
        time.sleep(0.05)  # training; the producer may sample at most one batch ahead
        assert max(b for b, _ in log) <= step + 1
        sched.publish(f"w{step + 1}", step + 1)
    sched.close()


def test_drop_policy_discards_stale_batches():
    log = []
    sched = AsyncSchedule(_fake_producer(log), max_staleness=1, policy="drop", start_step=0)
    sched.publish("w0", 0)
    time.sleep(0.2)  # the producer fills the queue with version-0 batches
    sched.publish("w3", 3)  # the trainer jumped ahead
    batch = sched.next(3)
    assert 3 - batch.version <= 1 and sched.dropped >= 1
    sched.close()


def test_dynamic_sampling_fills_with_groups_that_vary_within_its_budget():
    from types import SimpleNamespace

    from rlkit.curriculum import DynamicSampling

    rounds_of = iter([[1, 0, 1], [0, 1], [0, 0], [1]])  # 1: the group has reward variance

    def draw(n):
        got = next(rounds_of)[:n]
        return [SimpleNamespace(has_variance=bool(v), id=i) for i, v in enumerate(got)]

    groups, drawn, rounds = DynamicSampling(enabled=True, max_rounds=2).fill(3, draw)
    # round 1 keeps 2 of 3; round 2 draws 1 without variance; budget spent: a third draw of 1, kept as it is
    assert [g.has_variance for g in groups] == [True, True, False] and (drawn, rounds) == (5, 2)
    off = DynamicSampling(enabled=False).fill(2, lambda n: [SimpleNamespace(has_variance=False)] * n)
    assert len(off[0]) == 2 and off[1:] == (2, 0)
