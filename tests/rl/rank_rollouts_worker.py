"""Run by tests/rl/test_rank_rollouts.py under ``torchrun --nproc-per-node 2`` (gloo, CPU): the
tiny model's real sampler behind a wrapper that records which prompts this rank sampled, and
``collect_groups`` on 2 ranks. Each rank writes what it saw as JSON to ``argv[1]``/rank<r>.json:

- ``sampled``: the problem indices this rank's sampler was asked for (its share);
- ``groups``: every group's tokens and rewards as collect_groups returned them (all groups);
- ``concurrent``: two calls started on two threads, in opposite orders on the two ranks;
- ``error``: what a rollout that raises on one rank's group raised on this rank;
- ``keys_left``: the store's key count after the exchanges minus before (0: cleaned up)."""

import json
import sys
import threading
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

import rlkit  # noqa: E402
from rlkit.rl.collect import RolloutPolicy, collect_groups  # noqa: E402
from rlkit.rl.rank_rollouts import _store  # noqa: E402
from rlkit.tasks import SingleTurnEnvGroup  # noqa: E402
from rlkit.types import SamplingParams  # noqa: E402
from toy_task import ToyTask  # noqa: E402


class Recording:
    """The real sampling client; records the prompts it is asked to sample."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []

    def sample(self, model_input, num_samples, sampling_params):
        self.prompts.append(model_input.to_ints())
        return self.inner.sample(model_input, num_samples=num_samples, sampling_params=sampling_params)


class Raising(SingleTurnEnvGroup):
    def make_envs(self, n):
        raise ValueError(f"no envs for {self.problem['question']}")


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    service = rlkit.connect("local", precision="fp32")
    sampler = Recording(service.create_sampling_client(base_model="tiny"))
    tokenizer = sampler.inner.get_tokenizer()
    task = ToyTask(num_train=5)
    problems = task.problems("train")
    params = SamplingParams(max_tokens=4, temperature=1.0)
    dist.barrier()
    keys_before = _store().num_keys()

    groups = collect_groups(sampler, [task.env_group(p, tokenizer) for p in problems], 3, params, RolloutPolicy(),
                            concurrency=2, seeds=[10 + i for i in range(len(problems))])
    prompts = [task.env_group(p, tokenizer).make_envs(1)[0].initial_observation() for p in problems]
    sampled = sorted({prompts.index(p) for p in sampler.prompts})

    def call(name, seeds, into):
        into[name] = [[t.tokens for t in g.trajectories] for g in collect_groups(
            sampler, [task.env_group(p, tokenizer) for p in problems[:2]], 2, params, RolloutPolicy(), seeds=seeds)]

    concurrent = {}
    order = [("a", [1, 2]), ("b", [3, 4])]
    threads = []
    for name, seeds in (order if rank == 0 else order[::-1]):
        threads.append(threading.Thread(target=call, args=(name, seeds, concurrent)))
        threads[-1].start()
    for t in threads:
        t.join()

    error = None
    bad = [task.env_group(p, tokenizer) for p in problems[:2]]
    bad[1] = Raising(bad[1].prompt, bad[1].problem, bad[1].reward_fn, tokenizer)
    try:
        collect_groups(sampler, bad, 2, params, RolloutPolicy(), seeds=[0, 1])
    except ValueError as exc:
        error = str(exc)
    dist.barrier()
    keys_left = _store().num_keys() - keys_before
    (out / f"rank{rank}.json").write_text(json.dumps({
        "sampled": sampled,
        "groups": [{"tokens": [t.tokens for t in g.trajectories], "rewards": g.rewards} for g in groups],
        "concurrent": concurrent, "error": error, "keys_left": keys_left}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
