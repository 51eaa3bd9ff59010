"""``compute_logprobs`` calls queued together, scored together: shared prefixes computed once.

An evaluation asks for many scores at once, and they overlap: a multiple-choice question's
continuations share its context (few-shot examples included), a loglikelihood task's requests
share a fixed few-shot preamble. :func:`score_many` scores a list of token sequences under the
sampler's current (merged) weights:

- **groups by prefix.** Sequences sorted as token lists sit next to those they share a prefix
  with; :func:`prefix_groups` cuts that order into runs computing the fewest positions (a run
  shares the shortest common prefix of its neighbours, at least :data:`MIN_SHARED` tokens).
- **a group** runs its prefix once (one row, its KV cache kept), then every member's remaining
  tokens as one right-padded batch attending to that cache (:meth:`DynamicCache.batch_repeat_interleave`);
- **sequences sharing nothing** run as right-padded batches of similar length, at most
  :data:`TOKENS_PER_PASS` padded tokens a pass.

Right padding needs no attention mask: a causal model's real positions never see the pads after
them. The last token of a sequence is only a target, never an input (as in
:meth:`~.sampler.Sampler.prompt_logprobs`), so a sequence may be one token longer than the context.
Logprobs come from the model's own output layer (soft-capped where the model caps), a chunk of
rows at a time. They equal one-at-a-time scoring up to float rounding (summation order of the
batched matrix products): within 1e-5 per token in fp32 (``tests/harness``).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from rlkit.backends.local.families import logit_softcap, output_logits

MIN_SHARED = 16  # tokens a group must share before its prefix is computed once
RUN_COST = 32  # a group's own pass, in positions (its prefix is a separate forward)
TOKENS_PER_PASS = 8192  # padded tokens in one batched forward (bounds activation memory)
CHUNK_ROWS = 256  # rows of logits at a time (256 x 49k float32 = 48 MiB for SmolLM2)


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_groups(seqs: Sequence[Sequence[int]]) -> List[Tuple[int, List[int]]]:
    """``[(shared prefix length, member indices)]`` covering every sequence once, fewest positions
    computed: the sequences sorted as token lists, cut into runs of neighbours (dynamic programming
    over the runs; a run of k sharing p tokens costs its members' lengths less (k - 1) x p, plus
    :data:`RUN_COST` for its pass). A group's prefix leaves every member at least one token of its own."""
    order = sorted(range(len(seqs)), key=lambda k: list(seqs[k]))
    n = len(order)
    lengths = [len(seqs[i]) - 1 for i in order]  # the positions a sequence feeds
    lcp = [_common(seqs[order[k]], seqs[order[k + 1]], min(lengths[k], lengths[k + 1])) for k in range(n - 1)]
    best = [0.0] * (n + 1)  # best[j]: the cheapest cover of the first j sequences
    cut: List[Tuple[int, int]] = [(0, 0)] * (n + 1)  # best[j]'s last run: (its start, its shared prefix)
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1] + lengths[j - 1] + RUN_COST, (j - 1, 0)
        shared, total = 1 << 62, lengths[j - 1]
        for a in range(j - 2, -1, -1):  # the run order[a:j]
            shared, total = min(shared, lcp[a]), total + lengths[a]
            if shared < MIN_SHARED:
                break
            cost = best[a] + total - (j - a - 1) * shared + RUN_COST
            if cost < best[j]:
                best[j], cut[j] = cost, (a, shared)
    groups: List[Tuple[int, List[int]]] = []
    j = n
    while j > 0:
        a, shared = cut[j]
        groups.append((shared, [order[k] for k in range(a, j)]))
        j = a
    return groups[::-1]


def _target_logprobs(sampler: Any, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[target]`` per row of ``hidden`` ``[N, d]``, a chunk of rows at a time."""
    cap = logit_softcap(sampler.model.config)
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for s in range(0, hidden.shape[0], CHUNK_ROWS):
        logits = output_logits(sampler.lm_head, hidden[s:s + CHUNK_ROWS], cap)
        # log_softmax, as prompt_logprobs and lm-eval's hf model take it: logsumexp's float32 sum over a
        # 49k vocabulary runs ~1e-5 nats a token low on CPU (a bias, not noise: 2e-3 over 200 tokens)
        out[s:s + CHUNK_ROWS] = torch.log_softmax(logits, -1).gather(-1, targets[s:s + CHUNK_ROWS, None]).squeeze(-1)
    return out


def _padded(rows: Sequence[Sequence[int]], pad: int, device: Any) -> torch.Tensor:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
    return ids.to(device)


def _gather(hidden: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """The first ``lengths[i]`` rows of ``hidden[i]`` (``[B, T, d]``), concatenated: the real positions."""
    return torch.cat([hidden[i, :n] for i, n in enumerate(lengths) if n > 0]) if any(lengths) else hidden[:0, 0]


def _score_alone(sampler: Any, seqs: Sequence[Sequence[int]], out: List[List[Optional[float]]], index: List[int]) -> None:
    """Sequences sharing nothing: right-padded batches of similar length."""
    order = sorted(index, key=lambda i: -len(seqs[i]))
    start = 0
    while start < len(order):
        width = len(seqs[order[start]]) - 1
        take = max(1, TOKENS_PER_PASS // max(width, 1))
        batch = order[start:start + take]
        start += len(batch)
        inputs = [list(seqs[i][:-1]) for i in batch]
        hidden = sampler.decoder(input_ids=_padded(inputs, sampler.pad_id, sampler.device)).last_hidden_state
        targets = torch.tensor([t for i in batch for t in seqs[i][1:]], dtype=torch.long, device=sampler.device)
        values = _target_logprobs(sampler, _gather(hidden, [len(r) for r in inputs]), targets).tolist()
        at = 0
        for i in batch:
            n = len(seqs[i]) - 1
            out[i] = [None, *values[at:at + n]]
            at += n


def _score_group(sampler: Any, seqs: Sequence[Sequence[int]], p: int, members: List[int],
                 out: List[List[Optional[float]]]) -> None:
    """Members sharing their first ``p`` tokens: the prefix once, then every member's rest in one batch."""
    prefix = torch.tensor([list(seqs[members[0]][:p])], dtype=torch.long, device=sampler.device)
    first = sampler.decoder(input_ids=prefix, use_cache=True)
    head = first.last_hidden_state[0]  # [p, d]: position j predicts token j + 1
    own = torch.tensor([seqs[i][p] for i in members], dtype=torch.long, device=sampler.device)
    shared_values = _target_logprobs(sampler, head[:-1], prefix[0, 1:]).tolist() if p > 1 else []
    first_own = _target_logprobs(sampler, head[-1:].expand(len(members), -1), own).tolist()
    rests = [list(seqs[i][p:-1]) for i in members]  # inputs after the prefix (the last token is only a target)
    rest_values: List[List[float]] = [[] for _ in members]
    if any(rests):
        cache = first.cache
        cache.batch_repeat_interleave(len(members))
        ids = _padded([r or [sampler.pad_id] for r in rests], sampler.pad_id, sampler.device)
        positions = torch.arange(p, p + ids.shape[1], device=sampler.device).unsqueeze(0).expand(len(members), -1)
        hidden = sampler.decoder(input_ids=ids, cache=cache, position_ids=positions, use_cache=True).last_hidden_state
        targets = torch.tensor([t for i in members for t in seqs[i][p + 1:]], dtype=torch.long, device=sampler.device)
        flat = _target_logprobs(sampler, _gather(hidden, [len(r) for r in rests]), targets).tolist()
        at = 0
        for k, r in enumerate(rests):
            rest_values[k] = flat[at:at + len(r)]
            at += len(r)
    for k, i in enumerate(members):
        out[i] = [None, *shared_values, first_own[k], *rest_values[k]]


@torch.inference_mode()
def score_many(sampler: Any, seqs: Sequence[Sequence[int]]) -> List[List[Optional[float]]]:
    """``compute_logprobs`` of every sequence (``[None, log p(t1|t0), ...]``) under the weights the
    sampler has set, shared prefixes computed once (see the module docstring)."""
    out: List[List[Optional[float]]] = [[None] for _ in seqs]
    alone: List[int] = []
    for p, members in prefix_groups(seqs):
        if len(members) > 1 and p >= MIN_SHARED:
            _score_group(sampler, seqs, p, members, out)
        else:
            alone.extend(i for i in members if len(seqs[i]) > 1)
    if alone:
        _score_alone(sampler, seqs, out, alone)
    return out
