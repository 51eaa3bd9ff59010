"""The sampling client of ``backend.sampler=vllm``: the session contract over vLLM servers.

Prompts go as token ids, sampled token ids come back exact (``return_tokens_as_token_ids`` /
``return_token_ids``: never decoded and re-encoded) with their logprobs, and ``compute_logprobs``
reads vLLM's ``prompt_logprobs``. A client is bound to one adapter name (one weight version, or
the base model): every request names it as ``model`` and every answer is checked to come from it,
so a client bound to version k samples from version k, never a stale or newer adapter silently.

Logprobs are under the distribution sampled from when the server runs with
``--logprobs-mode processed_logprobs`` (what ``backend.vllm.launch=true`` starts; start your own
servers with it too): temperature applied, like the local sampler. With ``top_k``/``top_p`` vLLM
also renormalises over the kept tokens, which the local sampler does not.
"""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

from rlkit.backends.vllm.pool import ServerPool
from rlkit.errors import InvalidInputError, OperationError
from rlkit.futures import APIFuture
from rlkit.engine.capabilities import Capabilities
from rlkit.engine.clients import SamplingClientBase
from rlkit.types import SampledSequence, SampleResponse, SamplingParams, StopReason, TokenLogprob, TokenUsage


class VllmSamplingClient(SamplingClientBase):
    """Samples from one adapter (``adapter=None``: the base model) on a :class:`ServerPool` (the
    contract's checks are :class:`rlkit.engine.clients.SamplingClientBase`'s)."""

    extensions = frozenset({"on_token", "stop_token_ids"})

    def __init__(self, pool: ServerPool, adapter: Optional[str], *, tokenizer: Callable[[], Any], vocab_size: int,
                 max_positions: int, stop_token_ids: Sequence[int], capabilities: Capabilities,
                 executor: concurrent.futures.Executor, version: Optional[int] = None):
        self._pool = pool
        self.adapter = adapter
        self.model = adapter or pool.base_name  # the ``model`` of every request, and of every answer
        self.version = version  # the weight version this client samples from (None: base or a checkpoint)
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._max_positions = max_positions
        self._stop_token_ids = [int(t) for t in stop_token_ids]
        self._capabilities = capabilities
        self._executor = executor
        self._stopped = False
        self._release_once = threading.Lock()
        if adapter is not None:  # the adapter stays loaded while this client (or a copy of it) lives
            self._finalizer = weakref.finalize(self, pool.release, adapter)

    def get_tokenizer(self) -> Any:
        return self._tokenizer()

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_positions(self) -> int:
        return self._max_positions

    context_window = max_positions  # the same bound under the name serve's clients read

    # -- sample ------------------------------------------------------------------------------------
    def _sample(self, tokens: List[int], num_samples: int, params: SamplingParams, include_prompt_logprobs: bool,
                topk_prompt_logprobs: Optional[int], on_token: Optional[Callable[[int, int], None]] = None,
                stop_token_ids: Optional[Sequence[int]] = None) -> APIFuture[SampleResponse]:
        """``num_samples`` completions of ``prompt`` in one request (one server, one prefill).
        ``stop_token_ids`` as on the local backend (``[]``: stop on none); ``on_token`` streaming
        is refused (vLLM answers whole completions here)."""
        if params.seed is not None and not self.capabilities.per_request_seed:
            raise InvalidInputError(
                "sample: sampling_params.seed cannot be honoured on vllm: a per-request seed crashes vLLM's CPU engine "
                "(set backend.vllm.per_request_seed=true for GPU servers, or leave seed unset)"
            )
        if on_token is not None:
            raise InvalidInputError("sample: on_token (token streaming) cannot be honoured on vllm; sample on backend.sampler=local")
        stops = self._stop_token_ids if stop_token_ids is None else [int(t) for t in stop_token_ids]
        bad = [t for t in stops if t < 0 or t >= self._vocab_size]
        if bad:
            raise InvalidInputError(f"sample: stop token id {bad[0]} is outside the vocabulary [0, {self._vocab_size})")
        body = self._body(tokens, num_samples, params, stops)
        if include_prompt_logprobs or topk_prompt_logprobs:
            body["prompt_logprobs"] = int(topk_prompt_logprobs or 0)
        return self._submit(lambda: self._parse(self._send(body), tokens, include_prompt_logprobs, topk_prompt_logprobs), "sample")

    def _body(self, tokens: List[int], n: int, params: SamplingParams, stops: List[int]) -> Dict[str, Any]:
        temperature = 1.0 if params.temperature is None else float(params.temperature)
        greedy = params.greedy
        body: Dict[str, Any] = {
            "model": self.model,
            "prompt": tokens,
            "n": n,
            "max_tokens": params.max_tokens,
            "temperature": 0.0 if greedy else temperature,
            "logprobs": 0,  # the sampled token's own logprob
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "ignore_eos": True,  # the stop tokens are exactly ``stop_token_ids`` (the model's end-of-turn tokens)
            "stop_token_ids": stops,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if params.top_p is not None and not greedy:
            body["top_p"] = float(params.top_p)
        if params.top_k is not None and params.top_k > 0 and not greedy:
            body["top_k"] = int(params.top_k)
        if params.stop:
            body["stop"] = list(params.stop)
            body["include_stop_str_in_output"] = True
        if params.seed is not None:
            body["seed"] = int(params.seed)
        return body

    def _send(self, body: Dict[str, Any]) -> Dict[str, Any]:
        server = self._pool.pick()
        try:
            answer = server.completions(body)
        finally:
            self._pool.done(server)
        served = answer.get("model")
        if served != self.model:
            raise OperationError(
                f"{server.where()} answered from model {served!r}, not {self.model!r}: a stale or foreign adapter; "
                "nothing from it was used"
            )
        return answer

    def _parse(self, answer: Dict[str, Any], tokens: List[int], want_prompt: bool, topk: Optional[int]) -> SampleResponse:
        choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
        sequences = [self._sequence(c) for c in choices]
        prompt_lp = topk_lp = None
        if want_prompt or topk:
            entries = choices[0].get("prompt_logprobs") or answer.get("prompt_logprobs")
            if entries is None or len(entries) != len(tokens):
                raise OperationError(f"vLLM returned {0 if entries is None else len(entries)} prompt logprobs for {len(tokens)} prompt tokens")
            if want_prompt:
                prompt_lp = _prompt_logprobs(entries, tokens)
            if topk:
                topk_lp = [None if e is None else _topk(e, topk) for e in entries]
        usage = TokenUsage(prefill_tokens=len(tokens), decode_tokens=sum(len(s.tokens) for s in sequences))
        return SampleResponse(sequences=sequences, prompt_logprobs=prompt_lp, topk_prompt_logprobs=topk_lp, usage=usage)

    @staticmethod
    def _sequence(choice: Dict[str, Any]) -> SampledSequence:
        lp = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            ids = [_token_id(t) for t in lp.get("tokens") or []]
        logprobs = [float(x) for x in (lp.get("token_logprobs") or [])]
        if len(logprobs) != len(ids):
            raise OperationError(f"vLLM returned {len(ids)} tokens but {len(logprobs)} logprobs for one completion")
        reason = StopReason.LENGTH if choice.get("finish_reason") == "length" else StopReason.STOP
        return SampledSequence(stop_reason=reason, tokens=[int(t) for t in ids], logprobs=logprobs)

    # -- compute_logprobs --------------------------------------------------------------------------
    def _compute_logprobs(self, tokens: List[int]) -> APIFuture[List[Optional[float]]]:
        """One logprob per prompt token (the first is ``None``), from vLLM's ``prompt_logprobs``."""
        body = {"model": self.model, "prompt": tokens, "max_tokens": 1, "temperature": 0.0, "n": 1, "prompt_logprobs": 0,
                "return_tokens_as_token_ids": True, "ignore_eos": True}

        def run() -> List[Optional[float]]:
            entries = (self._send(body)["choices"][0].get("prompt_logprobs")) or []
            if len(entries) != len(tokens):
                raise OperationError(f"vLLM returned {len(entries)} prompt logprobs for {len(tokens)} tokens")
            return _prompt_logprobs(entries, tokens)

        return self._submit(run, "compute_logprobs")

    # -- plumbing ----------------------------------------------------------------------------------
    def _submit(self, fn: Callable[[], Any], operation: str) -> APIFuture:
        return APIFuture(self._executor.submit(fn), operation=operation)

    def stop(self) -> None:
        """Refuse new work; the adapter is released once no copy of this client is left. Idempotent."""
        self._stopped = True


def _token_id(token: Any) -> int:
    """``"token_id:123"`` (``return_tokens_as_token_ids``) -> 123."""
    text = str(token)
    if not text.startswith("token_id:"):
        raise OperationError(f"vLLM returned token {text!r} as text: the server must honour return_tokens_as_token_ids")
    return int(text[len("token_id:"):])


def _entry_logprob(entry: Dict[str, Any], token: int) -> float:
    value = entry.get(str(token), entry.get(f"token_id:{token}"))
    if value is None:
        raise OperationError(f"vLLM's prompt logprobs lack the prompt's own token {token}")
    return float(value["logprob"] if isinstance(value, dict) else value)


def _prompt_logprobs(entries: List[Any], tokens: List[int]) -> List[Optional[float]]:
    return [None] + [_entry_logprob(e, t) for e, t in zip(entries[1:], tokens[1:])]


def _topk(entry: Dict[str, Any], k: int) -> List[TokenLogprob]:
    ranked = sorted(((int(str(key).split(":")[-1]), v) for key, v in entry.items()), key=lambda kv: kv[1].get("rank", 0))
    return [TokenLogprob(token_id=t, logprob=float(v["logprob"])) for t, v in ranked if v.get("rank", k + 1) <= k][:k]
