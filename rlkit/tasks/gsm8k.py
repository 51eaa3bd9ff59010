"""GSM8K (Cobbe et al. 2021, arXiv:2110.14168): grade-school maths word problems.

Data: ``openai/gsm8k`` ("main") through ``datasets`` when online, else the project's
``shared/data/gsm8k/{train,test}.jsonl`` (byte-identical). Every reference answer is parsed when
the dataset loads (``#### N``); a row whose answer cannot be parsed is refused with its line.

Prompt: an instruction to reason briefly and finish with ``#### <number>``, optionally with solved
examples from the training set as earlier chat turns. Reward: :class:`~rlkit.rewards.math.MathAnswerReward`
(``#### N``, ``\\boxed{}``, "the answer is", or the last number; graded with math-verify and a
numeric fallback), optionally plus a weighted format reward.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from rlkit.chat import prompt_tokens
from rlkit.data import load_records
from rlkit.errors import DataError
from rlkit.rewards.base import WeightedSum
from rlkit.rewards.format import FormatReward
from rlkit.rewards.math import MathAnswerReward, parse_reference
from rlkit.tasks.base import Task, few_shot_messages, split_problems
from rlkit.tasks.single_turn import SingleTurnEnvGroup

INSTRUCTION = "Solve the problem. Reason briefly, then give the final answer on its own line as '#### <number>'."


class GSM8KTask(Task):
    name = "gsm8k"

    def __init__(
        self,
        train_path: str = "gsm8k/train.jsonl",
        test_path: str = "gsm8k/test.jsonl",
        hf_id: Optional[str] = None,
        num_train: Optional[int] = 40,
        num_test: Optional[int] = 50,
        test_start: int = 0,
        num_shots: int = 0,
        format_weight: float = 0.0,
    ):
        self.num_shots = num_shots
        self._splits: Dict[str, List[Dict[str, Any]]] = {}
        for split, path, limit, start in (("train", train_path, num_train, num_shots), ("test", test_path, num_test, test_start)):
            source = {"path": path, "hf_id": hf_id, "hf_config": "main", "split": split, "start": start, "limit": limit}
            locations: List[str] = []
            records = load_records(source, schema={"question": str, "answer": str}, name=f"gsm8k {split}", locations=locations)
            for record, where in zip(records, locations):
                try:
                    record["final"] = parse_reference(record["answer"])
                except DataError as exc:
                    raise DataError(f"{where}: {exc}") from None
            self._splits[split] = records
        self._shots = load_records({"path": train_path, "hf_id": hf_id, "hf_config": "main", "split": "train", "limit": num_shots}, name="gsm8k shots") if num_shots else []
        math_reward = MathAnswerReward()
        self._reward = WeightedSum([(1.0, math_reward), (format_weight, FormatReward())]) if format_weight else math_reward

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return split_problems("gsm8k", self._splits, split)

    def messages(self, problem: Mapping[str, Any]) -> List[Dict[str, str]]:
        return few_shot_messages(problem, self._shots, lambda p: f"{INSTRUCTION}\n\n{p['question']}", lambda s: s["answer"])

    def reference_completion(self, problem: Mapping[str, Any]) -> str:
        """The dataset's worked solution, ending in ``#### N`` (for the SFT baseline)."""
        return problem["answer"]

    def reward(self, completion: str, problem: Mapping[str, Any]) -> Any:
        return self._reward(completion, problem)

    def prompt(self, problem: Mapping[str, Any], tokenizer: Any) -> List[int]:
        return prompt_tokens(tokenizer, self.messages(problem))

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> SingleTurnEnvGroup:
        return SingleTurnEnvGroup(self.prompt(problem, tokenizer), problem, self.reward, tokenizer)
