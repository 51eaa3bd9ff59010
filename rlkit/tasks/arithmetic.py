"""Two-digit arithmetic, generated from a seed: the README's main RL job.

Prompt format (chosen by measurement on SmolLM2-135M-Instruct, see ``cookbook/arithmetic``): a
few solved examples as earlier chat turns, then the question, and the assistant turn prefilled with
``"a + b ="`` so the model's next tokens are the answer. Without examples and prefill the model
rambles and hits the token cap (pass@1 < 1%, almost no group has reward variance); with them,
addition has pass@1 ~25% at temperature 1 and ~75% of 8-sample groups have reward variance.

Reward: 1 if the first integer in the completion equals the answer, else 0.
"""

from __future__ import annotations

import random
import re
from typing import Any, Dict, List, Mapping, Sequence

from rlkit.chat import prompt_tokens
from rlkit.errors import ConfigError
from rlkit.rewards.base import RewardResult
from rlkit.tasks.base import Task, few_shot_messages, split_problems
from rlkit.tasks.single_turn import SingleTurnEnvGroup

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_INT = re.compile(r"-?\d+")


def first_integer(text: str):
    match = _INT.search(text.replace(",", ""))
    return int(match.group()) if match else None


class ArithmeticReward:
    """1.0 when the completion's first integer equals ``problem["answer"]``.

    ``brevity_credit`` (default 0: off) gives a wrong completion partial credit
    ``brevity_credit / (1 + len(completion.strip()))``: the terser, the more (a correct answer after
    the prefill is a few characters). It is a shaping term for smoke runs: the random tiny model never
    answers correctly, so without it every group's rewards are equal and the loss has no gradient;
    with it, completions of different lengths get different rewards (``reward/brevity``)."""

    name = "arithmetic"

    def __init__(self, brevity_credit: float = 0.0):
        if not 0.0 <= float(brevity_credit) < 1.0:
            raise ConfigError(f"task.brevity_credit={brevity_credit} must be in [0, 1) (below a correct answer's 1)")
        self.brevity_credit = float(brevity_credit)

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        value = first_integer(completion)
        correct = value is not None and value == int(problem["answer"])
        brevity = 0.0 if correct or not self.brevity_credit else self.brevity_credit / (1 + len(completion.strip()))
        metrics = {"correct": float(correct), "has_answer": float(value is not None)}
        if self.brevity_credit:
            metrics["brevity"] = brevity
        return RewardResult(reward=1.0 if correct else brevity, metrics=metrics, info={"predicted": value})


class ArithmeticTask(Task):
    """Problems ``a op b`` with ``a, b`` uniform in [low, high]; train/test sets never overlap."""

    name = "arithmetic"

    def __init__(
        self,
        ops: Sequence[str] = ("+",),
        low: int = 10,
        high: int = 99,
        num_train: int = 512,
        num_test: int = 100,
        num_shots: int = 3,
        seed: int = 0,
        prefill: bool = True,
        brevity_credit: float = 0.0,
    ):
        bad = [op for op in ops if op not in OPS]
        if bad or not ops:
            raise ConfigError(f"task.ops={list(ops)}: each must be one of {sorted(OPS)}")
        if low > high:
            raise ConfigError(f"task.low={low} > task.high={high}")
        space = len(ops) * (high - low + 1) ** 2
        if num_train + num_test + num_shots > space:
            raise ConfigError(f"task: {num_train + num_test} problems requested but only {space} exist")
        self.ops, self.num_shots, self.prefill = list(ops), num_shots, prefill
        rng = random.Random(seed)
        seen = set()
        problems: List[Dict[str, Any]] = []
        while len(problems) < num_train + num_test + num_shots:
            op = rng.choice(self.ops)
            a, b = rng.randint(low, high), rng.randint(low, high)
            if (a, op, b) in seen:
                continue
            seen.add((a, op, b))
            problems.append({"a": a, "b": b, "op": op, "question": f"What is {a} {op} {b}?", "answer": str(OPS[op](a, b))})
        self._shots = problems[:num_shots]
        self._splits = {"train": problems[num_shots : num_shots + num_train], "test": problems[num_shots + num_train :]}
        self._reward = ArithmeticReward(brevity_credit)

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return split_problems("arithmetic", self._splits, split)

    def messages(self, problem: Mapping[str, Any]) -> List[Dict[str, str]]:
        return few_shot_messages(problem, self._shots, lambda p: p["question"],
                                 lambda s: f"{s['a']} {s['op']} {s['b']} = {s['answer']}")

    def reward(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        return self._reward(completion, problem)

    def prompt(self, problem: Mapping[str, Any], tokenizer: Any) -> List[int]:
        prefill = f"{problem['a']} {problem['op']} {problem['b']} =" if self.prefill else ""
        return prompt_tokens(tokenizer, self.messages(problem), prefill=prefill)

    def reference_completion(self, problem: Mapping[str, Any]) -> str:
        """What a correct answer looks like after the prefill (for the SFT baseline)."""
        return f" {problem['answer']}" if self.prefill else f"{problem['a']} {problem['op']} {problem['b']} = {problem['answer']}"

    def tool_demonstration(self, problem: Mapping[str, Any]) -> Dict[str, Any]:
        """How a solver with a calculator answers (the SFT warm start of ``rlkit.tasks.tools``):
        one ``calculator`` call on the expression, then the bare result."""
        expression = f"{problem['a']} {problem['op']} {problem['b']}"
        call = {"name": "calculator", "arguments": {"expression": expression}}
        return {"calls": [call], "answer": str(problem["answer"])}

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> SingleTurnEnvGroup:
        return SingleTurnEnvGroup(self.prompt(problem, tokenizer), problem, self.reward, tokenizer)
