"""What fusing N runs can gain at most on this machine, measured on the base model alone
(``many_runs.py``'s judge prints it before its clients run; issue 43).

Fusion turns N runs' small batches into one batch N times larger. It cannot make the base model's
own work cheaper: the most it can gain is how much faster one big batch is than N small ones, over
the frozen base with no LoRA at all, in this process, with the server's thread count. Two numbers:

- **decode**: the :class:`~rlkit.backends.local.sampler.Sampler` samples one run's requests (the
  judge's prompts for client 0, ``--prompts`` x ``--group`` rows, ``--max-tokens`` tokens each, no
  stop tokens so every row decodes to the end) in ``t1``, and N runs' requests (clients 0..N-1) in
  one call in ``tN``: the ceiling of N runs' aggregate sampling throughput against one run's is
  ``N * t1 / tN``.
- **forward+backward**: the base model's forward over one run's rows (prompt + ``--max-tokens``
  tokens, padded to the longest), the summed log-probability of the tokens, and its backward to the
  input embeddings (the gradient a frozen base must carry to every LoRA site), for one run's rows
  (``t1``) and N runs' rows in one batch (``tN``): the training ceiling is ``N * t1 / tN``.

On a GPU a small batch leaves most of the device idle, so these ceilings are large. On a small CPU a
batch of 8 rows already streams every weight from memory each decode step and a training pass of
~200 tokens already runs near the matmul peak: a bigger batch then costs nearly proportionally more,
and these ceilings say by how much (median of ``repeats`` after one warm-up).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Sequence


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_ceiling(loaded, run_prompts: Sequence[List[List[int]]], group: int, max_tokens: int, precision: str,
                   repeats: int = 3) -> float:
    """``N * t1 / tN`` of the sampler over the base model (see the module docstring); ``run_prompts[k]``
    is run ``k``'s prompts (token ids), N = ``len(run_prompts)``."""
    from rlkit.backends.local.sampler import SampleRequest, Sampler
    from rlkit.types import SamplingParams

    sampler = Sampler(loaded.model, loaded.tokenizer, [], precision=precision)

    def requests(runs: Sequence[List[List[int]]]):
        return [SampleRequest(p, group, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 * k + i),
                              stop_token_ids=[])
                for k, prompts in enumerate(runs) for i, p in enumerate(prompts)]

    one = _median_time(lambda: sampler.sample(requests(run_prompts[:1])), repeats)
    all_runs = _median_time(lambda: sampler.sample(requests(run_prompts)), repeats)
    return len(run_prompts) * one / all_runs


def train_ceiling(loaded, run_prompts: Sequence[List[List[int]]], group: int, max_tokens: int, precision: str,
                  repeats: int = 3) -> float:
    """``N * t1 / tN`` of the base model's forward+backward (see the module docstring)."""
    import torch

    model = loaded.model
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    embed = model.get_input_embeddings()

    def batch(runs: Sequence[List[List[int]]]) -> torch.Tensor:
        rows = [p + [p[-1]] * max_tokens for prompts in runs for p in prompts for _ in range(group)]
        width = max(map(len, rows))
        return torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows])

    def step(ids: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            x = embed(ids).detach().requires_grad_(True)
            logits = model(inputs_embeds=x).logits[:, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).sum()
        lp.backward()

    requires = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        one_ids, all_ids = batch(run_prompts[:1]), batch(run_prompts)
        one = _median_time(lambda: step(one_ids), repeats)
        all_runs = _median_time(lambda: step(all_ids), repeats)
    finally:
        for p, r in zip(model.parameters(), requires):
            p.requires_grad_(r)
    return len(run_prompts) * one / all_runs


def print_ceilings(args, tokenizer, client_prompts: Callable, runs: int = 4) -> None:
    """The judge's "ceilings" line for ``runs`` runs (the issue's goals are stated at 4)."""
    import torch

    from rlkit.backends.local.models import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        loaded = load_model(args.model)
        prompts = [client_prompts(tokenizer, k, args.prompts) for k in range(runs)]
        d = decode_ceiling(loaded, prompts, args.group, args.max_tokens, args.precision)
        t = train_ceiling(loaded, prompts, args.group, args.max_tokens, args.precision)
    finally:
        torch.set_num_threads(threads)
    print(f"ceilings on this machine ({args.precision}, {args.threads} threads; the base model alone in one process, no "
          f"LoRA, no server): {runs} runs' rows in one batch vs one run's, N x t1 / tN: decode {d:.2f}x, "
          f"forward+backward {t:.2f}x (no fusion can gain more than these)", flush=True)
