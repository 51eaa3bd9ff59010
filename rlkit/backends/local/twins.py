"""Identical sampling requests on the base weights, decoded once (issue 43: many runs, one engine).

Runs that share an engine often ask for the very same samples. Every LoRA run starts from the
base model (``B = 0``: the adapter adds nothing), so at step 0 the arms of one seed in ``rlkit repro
jobs=shared`` evaluate the same greedy answers and the same seeded pass@k samples, and the jobs of
a Hydra sweep over a learning rate draw the same first rollouts. Two requests are *twins* when the
answer of one is, by the sampler's own guarantee, the answer of the other:

- both sample from the base model: no weights, or a LoRA adapter whose every ``B`` is zero
  (:func:`adds_nothing`; its rows are base rows anyway: ``W + s·B·A = W``);
- the same prompt tokens, number of samples, :class:`~rlkit.types.SamplingParams`, stop tokens
  and prompt-logprob options;
- deterministic: greedy, or with an explicit ``params.seed`` (the sampler's draw depends only on
  the request's seed, not on its batchmates: Gumbel-max on a per-request generator). A request
  without a seed draws fresh randomness each time and never has a twin, nor does one with a
  token listener (``on_token``: it streams as the decode runs).

:class:`Twins` keeps the requests being decoded by their :func:`twin_key`; a twin that arrives
while its first is decoding waits for it, and one that arrives after it is answered from a small
store of recent answers. Each gets its own copy of the response (usage as billed per request, the
same as it would have been alone). If the first is cancelled or fails, its waiting twins are
decoded themselves (a client's cancellation never cancels another's request).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Hashable, List, Optional, Tuple

from rlkit.types import SampleResponse

#: answers kept for twins that arrive after their first finished (entries; responses are small)
RECENT = 256


def adds_nothing(adapter: Any) -> bool:
    """Whether a LoRA adapter ``{path: (A, B, scale)}`` leaves every weight as it is: each ``B``
    zero (a freshly initialised LoRA) or its scale 0. ``False`` for anything else (full weights)."""
    if not isinstance(adapter, dict) or not adapter:
        return False
    for value in adapter.values():
        if not (isinstance(value, tuple) and len(value) == 3):
            return False
        _, b, scale = value
        if scale != 0 and bool(b.any()):
            return False
    return True


def twin_key(request: Any) -> Optional[Hashable]:
    """The key under which ``request`` (a :class:`~.sampler.SampleRequest` already given its
    weights) has twins, or ``None`` when it has none (see the module docstring)."""
    params = request.params
    if request.weights_key != "" or request.adapter is not None or request.on_token is not None:
        return None
    if not (params.greedy or params.seed is not None):
        return None
    stops = None if request.stop_token_ids is None else tuple(request.stop_token_ids)
    return (tuple(request.prompt), request.num_samples, params.model_dump_json(), stops,
            request.include_prompt_logprobs, request.topk_prompt_logprobs)


class Twins:
    """Requests being decoded by their twin key, the twins waiting on each, and recent answers.

    Items are whatever the caller tracks (the sampler worker's jobs); only their identity is used.
    One thread (the sampler's) calls every method."""

    def __init__(self, recent: int = RECENT):
        self._first: Dict[Hashable, Any] = {}  # key -> the item being decoded
        self._key_of: Dict[int, Hashable] = {}  # id(first item) -> its key
        self._waiting: Dict[int, List[Any]] = {}  # id(first item) -> its twins
        self._recent: "OrderedDict[Hashable, SampleResponse]" = OrderedDict()
        self._size = recent
        self.answered = 0  # requests answered by a twin's decode instead of their own

    def claim(self, item: Any, key: Optional[Hashable]) -> Tuple[str, Optional[SampleResponse]]:
        """What to do with ``item`` of twin key ``key``: ``("decode", None)`` (it decodes, and is
        the first of its key), ``("answered", response)`` (a recent twin's answer, a copy) or
        ``("waits", None)`` (a twin is decoding: :meth:`settle` answers it)."""
        if key is None:
            return "decode", None
        if key in self._recent:
            self._recent.move_to_end(key)
            self.answered += 1
            return "answered", self._recent[key].model_copy(deep=True)
        first = self._first.get(key)
        if first is not None:
            self._waiting[id(first)].append(item)
            self.answered += 1
            return "waits", None
        self._first[key], self._key_of[id(item)] = item, key
        self._waiting[id(item)] = []
        return "decode", None

    def settle(self, item: Any, response: Optional[SampleResponse]) -> List[Tuple[Any, Optional[SampleResponse]]]:
        """``item`` finished with ``response`` (``None``: cancelled or failed). Returns its waiting
        twins, each with its own copy of the response, or with ``None`` when they must decode
        themselves (the first did not finish). Items that were not the first of a key: ``[]``."""
        key = self._key_of.pop(id(item), None)
        if key is None:
            return []
        del self._first[key]
        waiting = self._waiting.pop(id(item))
        if response is None:
            self.answered -= len(waiting)
            return [(twin, None) for twin in waiting]
        self._recent[key] = response.model_copy(deep=True)
        while len(self._recent) > self._size:
            self._recent.popitem(last=False)
        return [(twin, response.model_copy(deep=True)) for twin in waiting]
