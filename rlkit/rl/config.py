"""The ``train`` section of RL recipes (``loop: rl``), typed for Hydra."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from rlkit.config import Aggregation, LoopConfig, require
from rlkit.harness.during_training import HarnessEvalConfig
from rlkit.rl.collect import RolloutPolicy
from rlkit.types import GREEDY_TEMPERATURE


@dataclass
class CurriculumConfig:
    name: str = "shuffled"  # fixed | shuffled | pass_rate_adaptive
    options: Dict[str, Any] = field(default_factory=dict)
    dynamic_sampling: bool = False  # DAPO: refill the batch with groups that have reward variance
    max_resample_rounds: int = 3  # extra sampling rounds dynamic sampling may spend per step


@dataclass
class RLEvalConfig:
    problems: int = 100  # held-out problems (the first N of the test split)
    pass_k: int = 4  # samples per problem for pass@k (0 = greedy accuracy only)
    temperature: float = 1.0
    max_tokens: Optional[int] = None  # null = train.max_tokens
    harness: HarnessEvalConfig = field(default_factory=HarnessEvalConfig)  # lm-evaluation-harness tasks (rlkit.harness.during_training)


@dataclass
class RLConfig(LoopConfig):
    """GRPO-style RL: groups of samples per problem, group-relative advantages, a policy loss."""

    task: Dict[str, Any] = field(default_factory=lambda: {"name": "arithmetic"})
    groups_per_batch: int = 8  # problems per step
    group_size: int = 8  # samples per problem
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    stop: List[str] = field(default_factory=list)
    advantage: str = "grpo"  # grpo | dr_grpo | rloo
    drop_zero_variance: bool = True  # drop groups whose rewards are all equal (no gradient)
    aggregation: Aggregation = Aggregation.token_mean
    aggregation_constant: Optional[float] = None  # Dr. GRPO's C (aggregation=constant)
    score_with_temperature: bool = True  # send the sampling temperature so the trainer scores the same distribution
    max_staleness: int = 0  # 0 = synchronous; k >= 1 = sample up to k steps ahead, overlapping training
    staleness_policy: str = "pace"  # pace (never sample more than k ahead) | drop (discard stale batches)
    concurrency: int = 8  # groups in flight at once (their sampling shares decode batches)
    transcripts: int = 4  # groups written to transcripts/ per step (0 = none)
    # mismatch/* (sampler vs trainer logprobs) on every step whose pass returned the trainer's logprobs
    # anyway (local, tinker), and every k-th step (0, k, 2k, ...) where they cost a scoring round trip
    # (SageMaker); 0 = only where free
    mismatch_every: int = 10
    rollout: RolloutPolicy = field(default_factory=RolloutPolicy)  # timeouts, failure policy, turns
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    eval: RLEvalConfig = field(default_factory=RLEvalConfig)

    def scoring_temperature(self) -> float:
        """The sampling temperature where the trainer scores with it (``score_with_temperature``, not greedy)."""
        t = float(self.temperature)
        return t if self.score_with_temperature and t >= GREEDY_TEMPERATURE else 1.0

    def temperature_fix(self, engine: str) -> str:
        return ("sample at train.temperature=1.0, or set train.score_with_temperature=false to train on these samples' "
                "temperature-1 logprobs (a sampler/trainer mismatch the mismatch/* metrics will show)")

    def check(self) -> None:
        super().check()
        for key in ("groups_per_batch", "group_size", "max_tokens", "concurrency"):
            require(getattr(self, key) >= 1, f"train.{key}", getattr(self, key), "must be >= 1")
        require(self.temperature >= 0, "train.temperature", self.temperature, "must be >= 0 (0 = greedy)")
        require(self.max_staleness >= 0, "train.max_staleness", self.max_staleness, "must be >= 0")
        require(self.transcripts >= 0, "train.transcripts", self.transcripts, "must be >= 0")
        require(self.mismatch_every >= 0, "train.mismatch_every", self.mismatch_every, "must be >= 0 (0 = only where free)")


@dataclass
class TaskSFTConfig(RLConfig):
    """``loop: task_sft``, an RL recipe's SFT baseline: the recipe's ``train`` section, trained on the
    task's reference answers; it scores no samples, whatever ``train.temperature`` says."""

    def scoring_temperature(self) -> float:
        return 1.0
