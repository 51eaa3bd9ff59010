"""A task whose reward varies on a random model (for RL loop tests): 1 when the completion has an
even number of characters."""

from rlkit.chat import prompt_tokens
from rlkit.rewards.base import RewardResult
from rlkit.tasks import SingleTurnEnvGroup, Task


def even_length(completion, problem):
    ok = len(completion) % 2 == 0
    return RewardResult(reward=float(ok), metrics={"correct": float(ok)})


class ToyTask(Task):
    name = "toy"

    def __init__(self, num_train=12, num_test=3):
        self._splits = {
            "train": [{"question": f"Say something about {i}."} for i in range(num_train)],
            "test": [{"question": f"Talk about {i}."} for i in range(num_test)],
        }

    def problems(self, split):
        return list(self._splits[split])

    def env_group(self, problem, tokenizer):
        prompt = prompt_tokens(tokenizer, [{"role": "user", "content": problem["question"]}])
        return SingleTurnEnvGroup(prompt, problem, even_length, tokenizer)
