"""lm-eval's three request kinds as session calls, all submitted before any is awaited.

An engine batches what is in flight together: the local sampler decodes every queued ``sample`` in
one continuous batch (prompts that are the same token ids prefilled once) and scores queued
``compute_logprobs`` calls as they come; a remote engine overlaps the HTTP round trips. So each
function here first submits one future per *distinct* request (duplicates — lm-eval's ``repeats``
of a greedy request, the same scoring window twice — are asked once) and only then waits.

- :func:`score` — ``compute_logprobs`` of each token window (one value per token, the first ``None``).
- :func:`greedy_tokens` — the greedy continuation of each prompt, ``n`` tokens long: whether a
  continuation is the model's greedy one (lm-eval's ``is_greedy``) is then a prefix test, because
  greedy decoding is deterministic: token *i* of the continuation is the argmax given the
  continuation's own tokens before it iff the greedy decode produced the same tokens so far.
- :func:`generate` — ``sample`` with text stop sequences (``SamplingParams.stop``), ``num_samples``
  of one prompt sharing its prefill.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

from rlkit.types import ModelInput, SamplingParams


def _progress(total: int, desc: str, disable: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=disable)


def score(client: Any, windows: Sequence[Sequence[int]], *, desc: str = "rlkit: loglikelihood",
          disable_tqdm: bool = True) -> List[List[Optional[float]]]:
    """``compute_logprobs`` of every window, in order (equal windows computed once). Windows are
    submitted in token order, so those sharing a prefix (a question's choices) reach the engine
    together and the local engine computes their prefix once."""
    keys = [tuple(w) for w in windows]
    distinct = sorted(set(keys))
    futures = {k: client.compute_logprobs(ModelInput.from_ints(k)) for k in distinct}
    values: Dict[Tuple[int, ...], List[Optional[float]]] = {}
    with _progress(len(distinct), desc, disable_tqdm) as bar:
        for k in distinct:
            values[k] = list(futures[k].result())
            bar.update(1)
    return [values[k] for k in keys]


def greedy_tokens(client: Any, wanted: Dict[Tuple[int, ...], int], *, stop_token_ids: Optional[List[int]] = None,
                  disable_tqdm: bool = True) -> Dict[Tuple[int, ...], List[int]]:
    """``{prompt: its greedy continuation of up to n tokens}`` for ``wanted = {prompt: n}`` (a
    decode that ends early, at an end-of-turn token, is shorter). ``stop_token_ids=[]`` (engines
    that take it) decodes the full ``n``."""
    extra = {} if stop_token_ids is None else {"stop_token_ids": stop_token_ids}
    futures = {p: client.sample(ModelInput.from_ints(p), 1, SamplingParams(max_tokens=n, temperature=0.0), **extra)
               for p, n in wanted.items()}
    out = {}
    with _progress(len(futures), "rlkit: greedy check", disable_tqdm) as bar:
        for prompt, future in futures.items():
            out[prompt] = list(future.result().sequences[0].tokens)
            bar.update(1)
    return out


def sampling_params(kwargs: Dict[str, Any], max_tokens: int, stop: List[str]) -> SamplingParams:
    """lm-eval's normalised generation kwargs (``do_sample``, ``temperature``, ``top_p``, ``top_k``,
    ``seed``) as :class:`~rlkit.types.SamplingParams`; ``do_sample=False`` is greedy (temperature 0)."""
    greedy = not kwargs.get("do_sample", False)
    temperature = 0.0 if greedy else float(kwargs.get("temperature", 1.0))
    top_p = kwargs.get("top_p")
    top_k = kwargs.get("top_k")
    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=temperature,
        top_p=None if greedy or top_p is None else float(top_p),
        top_k=None if greedy or top_k in (None, 0) else int(top_k),
        seed=None if kwargs.get("seed") is None else int(kwargs["seed"]),
        stop=[s for s in stop if s] or None,
    )


def generate(client: Any, jobs: Sequence[Tuple[List[int], SamplingParams]], *, disable_tqdm: bool = True) -> List[List[int]]:
    """The sampled tokens of each ``(prompt, params)`` job, in order. Equal greedy jobs are decoded
    once; equal sampled jobs become one ``sample(num_samples=k)`` (the prompt prefilled once)."""
    groups: Dict[Hashable, List[int]] = {}
    for i, (prompt, params) in enumerate(jobs):
        key = (tuple(prompt), json.dumps(params.model_dump(mode="json"), sort_keys=True))
        groups.setdefault(key, []).append(i)
    futures = {}
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[0][0])):
        prompt, params = jobs[members[0]]
        n = 1 if params.greedy else len(members)
        futures[key] = client.sample(ModelInput.from_ints(prompt), n, params)
    out: List[List[int]] = [[] for _ in jobs]
    with _progress(len(jobs), "rlkit: generate_until", disable_tqdm) as bar:
        for key, future in futures.items():
            sequences = future.result().sequences
            for j, i in enumerate(groups[key]):
                out[i] = list(sequences[0 if len(sequences) == 1 else j].tokens)
                bar.update(1)
    return out
