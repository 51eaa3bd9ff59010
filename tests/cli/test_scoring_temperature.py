"""Each loop config declares the temperature its trainer scores samples at (issue 52 item 4):
an engine whose trainer scores at temperature 1 only (Tinker) refuses a run that would ask for
another — for any loop, a new one included — without composition knowing the loops' classes."""

from dataclasses import dataclass

import pytest

from rlkit.composition import check_scoring_temperature, same_section
from rlkit.config import LoopConfig
from rlkit.errors import ConfigError
from rlkit.loops.distill import OnPolicyDistillConfig
from rlkit.rl.config import RLConfig, TaskSFTConfig

ONLY_1 = "Tinker's trainer scores at temperature 1 only; "


@dataclass
class SamplingLoop(LoopConfig):  # a loop of a user's that samples at its own temperature and scores with it
    temperature: float = 0.7

    def scoring_temperature(self) -> float:
        return self.temperature


def test_a_new_loop_that_scores_at_another_temperature_is_refused():
    with pytest.raises(ConfigError) as err:
        check_scoring_temperature(SamplingLoop(), "Tinker")
    assert str(err.value) == "train.temperature=0.7: " + ONLY_1 + "run this loop at temperature 1.0 on Tinker"
    check_scoring_temperature(SamplingLoop(temperature=1.0), "Tinker")
    check_scoring_temperature(LoopConfig(), "Tinker")  # the declared default: 1.0


def test_the_shipped_loops_declare_theirs():
    with pytest.raises(ConfigError, match="train.temperature=0.7: " + ONLY_1 + "sample at train.temperature=1.0, or set "
                       "train.score_with_temperature=false"):
        check_scoring_temperature(RLConfig(temperature=0.7), "Tinker")
    check_scoring_temperature(RLConfig(temperature=0.7, score_with_temperature=False), "Tinker")
    check_scoring_temperature(RLConfig(temperature=0.0), "Tinker")  # greedy: scored as sampled at 1
    with pytest.raises(ConfigError, match="train.temperature=0.5: " + ONLY_1 + "on-policy distillation on Tinker samples at"):
        check_scoring_temperature(OnPolicyDistillConfig(temperature=0.5), "Tinker")
    # loop=task_sft over an RL recipe's section: its schema says it scores no samples
    assert same_section(TaskSFTConfig, RLConfig) and not same_section(OnPolicyDistillConfig, LoopConfig)
    check_scoring_temperature(RLConfig(temperature=0.7), "Tinker", TaskSFTConfig)
