"""Any `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ dataset as an RL task
(``train.task.name=reasoning_gym train.task.dataset=NAME``; needs the ``gym`` extra).

reasoning-gym (Stojanovski et al. 2025, arXiv:2505.24760) generates about a hundred procedural
reasoning tasks from a seed, each with its own scorer. Every keyword the dataset's config takes
(``min_terms``, ``max_digits``, ...) is a task option, checked against that config (an unknown key
or dataset is one line with the nearest names). Options belong to a dataset:

- in ``options``, a key that names a reasoning-gym dataset holds *that* dataset's options
  (``options: {basic_arithmetic: {min_terms: 2}, countdown: {max_value: 9}}``, what recipes use):
  only the chosen dataset's block applies, so ``train.task.dataset=leg_counting`` alone switches a
  recipe to another dataset (at its defaults) without touching the recipe's options;
- any other key, flat on the task (``+train.task.max_animals=3``) or in ``options``, is an option of
  the chosen dataset. Precedence: the dataset's block, then ``options``' other keys, then flat keys.

Every block's keys are checked against its own dataset's config, chosen or not (a typo in a recipe
fails whichever dataset runs).

Splits: the problems are the dataset's entries ``0, 1, 2, ...`` for ``seed`` — the first
``num_shots`` are few-shot examples, then ``num_train`` training and ``num_test`` held-out problems.
A question that already appeared earlier is skipped, so the held-out split shares no question with
the training split or the examples (small problem spaces repeat). Same seed, same splits.

Prompt: reasoning-gym's own instruction (answer inside ``<answer>...</answer>``) as the system turn,
``num_shots`` solved examples as earlier chat turns, the question; with ``prefill: true`` (the
default) the assistant turn starts with ``<answer>`` so the model's first tokens are the answer —
the format that gives a 135M model reward variance (as for ``arithmetic``, see its module doc).

Reward: the dataset's own ``score_answer(answer, entry)`` (in [0, 1]; ``correct`` = a score of 1) on
the answer extracted by :func:`extract_gym_answer`. A scorer that raises fails the rollout under
``train.rollout.on_failure`` (counted in ``rollout/failed``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rlkit.chat import prompt_tokens
from rlkit.errors import ConfigError
from rlkit.rewards.base import RewardResult
from rlkit.tasks.base import Task, few_shot_messages, split_problems
from rlkit.tasks.single_turn import SingleTurnEnvGroup

INSTRUCTION = (
    "Answer the question. Give the final answer inside <answer></answer> tags, with nothing else in them. "
    "When an example is provided, follow the format of its answer exactly."
)
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPEN = re.compile(r"<answer>(.*)$", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_SAID = re.compile(r"(?:final answer|the answer is|answer)\s*[:=]?\s*(.+)", re.IGNORECASE)


def extract_gym_answer(completion: str, prefilled: bool = False) -> Optional[str]:
    """The answer in ``completion``, or ``None``: after a ``<answer>`` prefill, the text up to
    ``</answer>`` (or the end of its first line); otherwise the last ``<answer>...</answer>``, an
    unclosed ``<answer>`` to the end of its line, the last ``\\boxed{...}``, a ``final answer: X`` /
    ``the answer is X`` line, else the first non-empty line."""
    text = completion or ""
    if prefilled:
        head = text.split("</answer>", 1)[0] if "</answer>" in text.lower() else text.strip().split("\n", 1)[0]
        text_answer = head.strip()
        return text_answer or None
    tagged = _TAGGED.findall(text)
    if tagged:
        return tagged[-1].strip()
    opened = _OPEN.search(text)
    if opened and opened.group(1).strip():
        return opened.group(1).strip().split("\n", 1)[0].strip()
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    said = _SAID.findall(text)
    if said:
        return said[-1].strip().rstrip(".").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else None


def dataset_names() -> List[str]:
    import reasoning_gym

    return sorted(reasoning_gym.factory.DATASETS)


def _import_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError("task.name=reasoning_gym needs the reasoning-gym package: pip install 'rlkit[gym]' "
                          "(or reasoning-gym==0.1.25)") from None
    return reasoning_gym


def _unknown_option(key: str, name: str, fields: List[str], where: str) -> ConfigError:
    near = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return ConfigError(f"{where}: not an option of reasoning-gym's {name} (accepts {fields}){hint}")


def option_fields(gym: Any, name: str) -> List[str]:
    """The keywords reasoning-gym's ``name`` config takes (``seed`` and ``size`` are the task's)."""
    _, config_cls = gym.factory.DATASETS[name]
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]


def options_for(name: str, options: Optional[Mapping[str, Any]], flat: Mapping[str, Any],
                where: str = "task") -> Dict[str, Any]:
    """The options for dataset ``name``: its own block in ``options`` (a key naming a dataset holds
    that dataset's options; other datasets' blocks are checked against their configs, then left
    out), ``options``' other keys, then ``flat`` (the task's own keywords), later winning. Every key
    is checked against its dataset's config: one line naming where it was written."""
    gym = _import_gym()
    check_dataset_name(name, where)
    registry = gym.factory.DATASETS
    fields = option_fields(gym, name)
    own: Dict[str, Any] = {}
    loose: Dict[str, Tuple[Any, str]] = {}
    for key, value in dict(options or {}).items():
        if key in registry:
            if value is not None and not isinstance(value, Mapping):
                raise ConfigError(f"{where}.options.{key}: the {key} dataset's options are a mapping "
                                  f"(option: value), not {value!r}")
            accepts = option_fields(gym, key)
            for sub in dict(value or {}):
                if sub not in accepts:
                    raise _unknown_option(sub, key, accepts, f"{where}.options.{key}.{sub}")
            if key == name:
                own = dict(value or {})
        elif isinstance(value, Mapping) and key not in fields:  # a block for a dataset that does not exist
            near = difflib.get_close_matches(str(key), list(registry), n=3, cutoff=0.5)
            hint = f"; nearest: {', '.join(near)}" if near else ""
            raise ConfigError(f"{where}.options.{key}: not a reasoning-gym dataset whose options these could be{hint}")
        else:
            loose[key] = (value, f"{where}.options.{key}")
    loose.update({key: (value, f"{where}.{key}") for key, value in flat.items()})
    for key, (_, at) in loose.items():
        if key not in fields:
            raise _unknown_option(key, name, fields, at)
    return {**own, **{key: value for key, (value, _) in loose.items()}}


def check_dataset_name(name: str, where: str = "task") -> None:
    """One line naming the nearest reasoning-gym datasets when ``name`` is not one."""
    registry = _import_gym().factory.DATASETS
    if name not in registry:
        near = difflib.get_close_matches(str(name), list(registry), n=5, cutoff=0.5)
        hint = f"; nearest: {', '.join(near)}" if near else ""
        raise ConfigError(f"{where}.dataset={name!r}: not a reasoning-gym dataset{hint} ({len(registry)} datasets: "
                          "python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))')")


def make_dataset(name: str, seed: int, size: int, options: Mapping[str, Any], where: str = "task") -> Any:
    """The reasoning-gym dataset ``name`` built with ``options`` (already :func:`options_for`;
    the dataset's own validation refusing them is one line)."""
    gym = _import_gym()
    check_dataset_name(name, where)
    try:
        return gym.create_dataset(name, seed=seed, size=size, **dict(options))
    except (AssertionError, ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: reasoning-gym's {name} refuses {dict(options)}: {exc or type(exc).__name__}") from None


class ReasoningGymReward:
    """The dataset's own scorer on the extracted answer: ``score_answer(answer, entry)``."""

    name = "reasoning_gym"

    def __init__(self, dataset: Any, prefilled: bool):
        self.dataset, self.prefilled = dataset, prefilled

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        answer = extract_gym_answer(completion, self.prefilled)
        entry = problem["entry"]
        score = float(self.dataset.score_answer(answer, entry)) if answer is not None else 0.0
        metrics = {"correct": float(score >= 1.0 - 1e-9), "has_answer": float(answer is not None), "score": score}
        return RewardResult(reward=score, metrics=metrics, info={"predicted": answer})


class ReasoningGymTask(Task):
    """A reasoning-gym dataset: seeded train / held-out splits, its scorer as the reward."""

    name = "reasoning_gym"

    def __init__(
        self,
        dataset: str = "",
        num_train: int = 512,
        num_test: int = 100,
        num_shots: int = 2,
        seed: int = 0,
        prefill: bool = True,
        instruction: str = INSTRUCTION,
        options: Optional[Dict[str, Any]] = None,
        **dataset_options: Any,
    ):
        if not dataset:
            raise ConfigError("task.dataset: name a reasoning-gym dataset (e.g. train.task.dataset=basic_arithmetic)")
        if num_train < 1 or num_test < 0 or num_shots < 0:
            raise ConfigError(f"task: num_train={num_train} must be >= 1, num_test={num_test} and num_shots={num_shots} >= 0")
        want = num_shots + num_train + num_test
        size = max(4 * want, 64)
        self.dataset_name, self.prefill, self.instruction = dataset, prefill, instruction
        dataset_options = options_for(dataset, options, dataset_options)
        self.dataset = make_dataset(dataset, seed, size, dataset_options)
        seen, problems = set(), []
        for index in range(size):
            entry = self.dataset[index]
            question = str(entry["question"])
            if question in seen:
                continue
            seen.add(question)
            answer = entry.get("answer")
            problems.append({"question": question, "answer": None if answer is None else str(answer), "index": index, "entry": entry})
            if len(problems) == want:
                break
        if len(problems) < want:
            raise ConfigError(f"task: reasoning-gym's {dataset} with {dataset_options or 'its defaults'} gave only {len(problems)} "
                              f"distinct questions in {size} draws; {want} wanted (lower num_train/num_test or widen the options)")
        self._shots = [p for p in problems[:num_shots]]
        self._splits = {"train": problems[num_shots: num_shots + num_train], "test": problems[num_shots + num_train:]}
        self._reward = ReasoningGymReward(self.dataset, prefill)

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return split_problems("reasoning_gym", self._splits, split)

    def messages(self, problem: Mapping[str, Any]) -> List[Dict[str, str]]:
        return few_shot_messages(problem, self._shots, lambda p: p["question"], lambda s: f"<answer>{s['answer']}</answer>",
                                 system=self.instruction)

    def prompt(self, problem: Mapping[str, Any], tokenizer: Any) -> List[int]:
        return prompt_tokens(tokenizer, self.messages(problem), prefill="<answer>" if self.prefill else "")

    def reward(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        return self._reward(completion, problem)

    def reference_completion(self, problem: Mapping[str, Any]) -> Optional[str]:
        """The dataset's answer in the prompt's format (``None`` where the dataset gives none)."""
        if problem.get("answer") is None:
            return None
        return f"{problem['answer']}</answer>" if self.prefill else f"<answer>{problem['answer']}</answer>"

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> SingleTurnEnvGroup:
        return SingleTurnEnvGroup(self.prompt(problem, tokenizer), problem, self.reward, tokenizer)
