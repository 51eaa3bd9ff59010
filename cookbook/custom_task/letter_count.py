"""A task in user code: "How many times does the letter 'r' appear in 'strawberry'?"

One file, one class. It subclasses :class:`rlkit.tasks.Task`, implements the two required members
(``problems``, ``env_group``) and the optional ones the loops use when present — ``prompt`` and
``messages`` (the first turn: what a distillation teacher re-renders and ``loop=task_sft`` trains
after), ``reward`` (grading a final answer) and ``reference_completion`` (the SFT baseline; its
presence is what makes ``has_references`` true). Everything else (``close``, joint group scoring)
keeps the base class's safe default.

    PYTHONPATH=cookbook/custom_task rlkit train recipe=arithmetic_grpo \\
        +train.task._target_=letter_count.LetterCountTask '~train.task.name' '~train.task.ops' '~train.task.num_shots'
"""

from __future__ import annotations

import random
import re
from typing import Any, Dict, List, Mapping

from rlkit.chat import prompt_tokens
from rlkit.rewards.base import RewardResult
from rlkit.tasks import SingleTurnEnvGroup, Task

WORDS = ["strawberry", "banana", "mississippi", "letter", "bookkeeper", "committee", "assessment", "parallel",
         "tomorrow", "balloon", "coffee", "success", "address", "possession", "referee", "tennessee"]


class LetterCountTask(Task):
    """Count a letter in a word; the answer is prefilled up to the number."""

    name = "letter_count"

    def __init__(self, num_train: int = 64, num_test: int = 16, seed: int = 0):
        rng = random.Random(seed)
        problems = []
        for _ in range(num_train + num_test):
            word = rng.choice(WORDS)
            letter = rng.choice(sorted(set(word)))
            problems.append({"word": word, "letter": letter, "answer": str(word.count(letter))})
        self._splits = {"train": problems[:num_train], "test": problems[num_train:]}

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return list(self._splits[split])

    def messages(self, problem: Mapping[str, Any]) -> List[Dict[str, str]]:
        return [{"role": "user", "content": f"How many times does the letter '{problem['letter']}' appear in '{problem['word']}'?"}]

    def prompt(self, problem: Mapping[str, Any], tokenizer: Any) -> List[int]:
        return prompt_tokens(tokenizer, self.messages(problem), prefill=f"'{problem['letter']}' appears")

    def reward(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        match = re.search(r"\d+", completion)
        correct = bool(match) and match.group() == problem["answer"]
        return RewardResult(reward=float(correct), metrics={"correct": float(correct)})

    def reference_completion(self, problem: Mapping[str, Any]) -> str:
        return f" {problem['answer']} times."

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> SingleTurnEnvGroup:
        return SingleTurnEnvGroup(self.prompt(problem, tokenizer), problem, self.reward, tokenizer)
