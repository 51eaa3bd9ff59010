"""Cost of the linearised loss path relative to the native one, on the local backend.

    python benchmarks/loss_paths.py [--model smollm2-135m-instruct] [--repeats 3]

The same PPO loss on the same RL batch (8 arithmetic prompts x 8 sampled completions), run as the
``ppo`` built-in (one forward_backward) and through the linearised path (forward, client-side
autograd, weighted cross-entropy forward_backward). Expected: about one extra forward pass,
i.e. ~1.3-1.5x. Also checks the two gradients agree.
"""

from __future__ import annotations

import argparse
import time
import warnings

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()

    import torch

    import rlkit
    from rlkit.losses import PPO, run_loss
    from rlkit.rl.advantages import compute_advantages
    from rlkit.rl.collect import RolloutPolicy, collect_groups
    from rlkit.rl.datums import trajectory_datum
    from rlkit.tasks.arithmetic import ArithmeticTask

    svc = rlkit.connect("local", precision=args.precision)
    trainer = svc.create_lora_training_client(args.model, rank=16, alpha=32, seed=0)
    tok = trainer.get_tokenizer()
    task = ArithmeticTask()
    sampler = trainer.save_weights_and_get_sampling_client()
    groups = collect_groups(sampler, [task.env_group(p, tok) for p in task.problems("train")[:8]], 8,
                            rlkit.SamplingParams(max_tokens=6, temperature=1.0), RolloutPolicy(), seeds=list(range(8)))
    data = []
    for g in groups:
        adv = compute_advantages([r + 0.01 * i for i, r in enumerate(g.rewards)])  # non-zero advantages everywhere
        data += [trajectory_datum(t, a, 1.0) for t, a in zip(g.trajectories, adv)]
    loss = PPO()

    def timed(force: bool) -> tuple[float, torch.Tensor]:
        best = float("inf")
        grads = None
        for _ in range(args.repeats):
            trainer._engine.optimizer.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            run_loss(trainer, data, loss, aggregation="token_mean", force_linearised=force).result()
            best = min(best, time.perf_counter() - t0)
            grads = torch.cat([p.grad.reshape(-1) for _, p in trainer._engine.named_trainable])
        return best, grads

    timed(False)  # warm-up
    native_s, g_native = timed(False)
    linear_s, g_linear = timed(True)
    forward_s = min(_forward_time(trainer, data) for _ in range(args.repeats))
    rel = float((g_native - g_linear).norm() / g_native.norm())
    tokens = sum(d.model_input.length for d in data)
    print(f"\n{len(data)} datums, {tokens} tokens ({args.model}, {args.precision})\n")
    print("| path | seconds | ratio to native |")
    print("|---|---|---|")
    print(f"| native ppo built-in | {native_s:.2f} | 1.00x |")
    print(f"| linearised (forward + autograd + cross-entropy backward) | {linear_s:.2f} | {linear_s / native_s:.2f}x |")
    print(f"| one forward alone (for reference) | {forward_s:.2f} | {forward_s / native_s:.2f}x |")
    print(f"\ngradient relative difference native vs linearised: {rel:.2e}")
    svc.close()


def _forward_time(trainer, data) -> float:
    from rlkit.losses.execute import cross_entropy_view

    t0 = time.perf_counter()
    trainer.forward([cross_entropy_view(d) for d in data], "cross_entropy").result()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
