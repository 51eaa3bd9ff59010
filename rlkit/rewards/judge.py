"""LLM-as-judge rewards over any OpenAI-compatible endpoint (``rlkit serve``, vLLM, a hosted API).

:class:`JudgeReward` is a reward callable ``(completion, problem) -> RewardResult``: it renders a
rubric prompt (the problem's question, the completion, optionally the reference answer), asks the
judge model through the official ``openai`` client, and parses ``Score: N`` from the reply; the
reward is the score scaled to [0, 1] (``(N - min_score) / (max_score - min_score)``).

- **Bounded concurrency**: at most ``max_concurrency`` requests of one judge are in flight at once,
  whatever the number of rollout threads.
- **Retries**: a 429, a 5xx, a refused connection or a timeout is retried up to ``max_retries``
  times with exponential backoff (``backoff_s * 2**k``, honouring ``Retry-After`` up to
  ``max_backoff_s``); other 4xx answers are not retried. Each attempt waits at most ``timeout_s``.
- **Caching**: identical requests (same model, messages, sampling settings) are answered from an
  in-memory cache (``cache=False`` turns it off); a cached answer costs no tokens.
- **Cost**: each scoring reports ``tokens/judge_prompt`` and ``tokens/judge_completion`` (the
  endpoint's ``usage``), which the RL loop sums per step into ``metrics.jsonl``, where ``rlkit cost
  run=DIR`` reports them.

A judge that fails (retries exhausted, a 4xx, an unparseable or out-of-range score) raises
:class:`JudgeError`: the rollout fails under ``train.rollout.on_failure`` (scored
``failure_reward`` by default, counted in ``rollout/failed``) and the run goes on. The error
carries its metrics (``judge/failed``, ``judge/unparseable``, tokens spent), which the collector keeps
on the failed turn.

Kim et al. 2023 (Prometheus, arXiv:2310.08491) and Zheng et al. 2023 (MT-Bench, arXiv:2306.05685)
describe rubric-based judging; this is the plain single-answer grading form.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rlkit.errors import ConfigError, OperationError
from rlkit.rewards.base import RewardResult

DEFAULT_RUBRIC = (
    "You are grading an answer to a question. Judge whether the answer is correct and helpful.\n\n"
    "Question:\n{question}\n\n{reference_block}Answer to grade:\n{completion}\n\n"
    "Reply with one line 'Score: N', where N is an integer from {min_score} (worst) to {max_score} (best)."
)
_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_ONLY = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*\d+)?\s*\.?\s*$")


class JudgeError(OperationError):
    """The judge could not score a completion; ``metrics`` says what it cost and why."""

    def __init__(self, message: str, metrics: Optional[Dict[str, float]] = None):
        super().__init__(message)
        self.metrics = dict(metrics or {})


def parse_score(text: str, min_score: float, max_score: float) -> Optional[float]:
    """``N`` from the last ``Score: N`` in ``text`` (or a reply that is only a number, ``7`` or
    ``7/10``), if it lies in ``[min_score, max_score]``; else ``None``."""
    found = _SCORE.findall(text or "")
    raw = found[-1] if found else None
    if raw is None:
        only = _NUMBER_ONLY.match(text or "")
        raw = only.group(1) if only else None
    if raw is None:
        return None
    value = float(raw)
    return value if min_score <= value <= max_score else None


def _retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


def _retry_after(exc: BaseException) -> Optional[float]:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class JudgeReward:
    """A judge model's rubric score as the reward (see the module docstring).

    Args:
        base_url: the endpoint's OpenAI base URL (``http://host:port/v1``).
        model: the judge model's id at that endpoint.
        api_key: the key; default ``$OPENAI_API_KEY``, else ``"EMPTY"`` (local servers take any).
        rubric: a ``str.format`` template with ``{question}``, ``{completion}``, ``{reference}``,
            ``{reference_block}``, ``{min_score}``, ``{max_score}``.
        question_key / reference_key: the problem fields shown as the question and the reference
            (``reference_key=null``: none shown).
    """

    name = "judge"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: Optional[str] = None,
        rubric: str = DEFAULT_RUBRIC,
        system_prompt: Optional[str] = None,
        min_score: float = 0,
        max_score: float = 10,
        max_tokens: int = 32,
        temperature: float = 0.0,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_concurrency: int = 4,
        cache: bool = True,
        question_key: str = "question",
        reference_key: Optional[str] = "answer",
    ):
        if max_score <= min_score:
            raise ConfigError(f"judge: max_score={max_score} must exceed min_score={min_score}")
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ConfigError(f"judge: max_concurrency={max_concurrency} >= 1, max_retries={max_retries} >= 0, timeout_s={timeout_s} > 0")
        try:
            rubric.format(question="", completion="", reference="", reference_block="", min_score=0, max_score=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"judge.rubric: not a template of {{question}}, {{completion}}, {{reference}}, {{min_score}}, "
                              f"{{max_score}}: {type(exc).__name__}: {exc}") from None
        self.base_url, self.model = base_url, model
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.rubric, self.system_prompt = rubric, system_prompt
        self.min_score, self.max_score = float(min_score), float(max_score)
        self.max_tokens, self.temperature = int(max_tokens), float(temperature)
        self.timeout_s, self.max_retries = float(timeout_s), int(max_retries)
        self.backoff_s, self.max_backoff_s = float(backoff_s), float(max_backoff_s)
        self.question_key, self.reference_key = question_key, reference_key
        self._slots = threading.BoundedSemaphore(int(max_concurrency))
        self._cache: Optional[Dict[str, Tuple[str, int, int]]] = {} if cache else None
        self._lock = threading.Lock()
        self._client: Any = None
        self.requests = 0  # HTTP requests sent (attempts), for tests and logs

    # -- the request ---------------------------------------------------------------------------

    def messages(self, completion: str, problem: Mapping[str, Any]) -> List[Dict[str, str]]:
        reference = str(problem.get(self.reference_key, "")) if self.reference_key else ""
        block = f"Reference answer:\n{reference}\n\n" if reference else ""
        text = self.rubric.format(question=problem.get(self.question_key, ""), completion=completion, reference=reference,
                                  reference_block=block, min_score=_fmt(self.min_score), max_score=_fmt(self.max_score))
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": text}]

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0)
            return self._client

    def _ask(self, messages: List[Dict[str, str]]) -> Tuple[str, int, int]:
        """``(reply text, prompt tokens, completion tokens)``, retrying 429/5xx/timeouts."""
        key = hashlib.sha256(json.dumps([self.model, messages, self.max_tokens, self.temperature]).encode()).hexdigest()
        if self._cache is not None:
            with self._lock:
                hit = self._cache.get(key)
            if hit is not None:
                return hit[0], 0, 0
        last: Optional[BaseException] = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                wait = min(self.max_backoff_s, max(self.backoff_s * 2 ** (attempt - 1), _retry_after(last) or 0.0))
                time.sleep(wait)
            try:
                with self._slots:
                    with self._lock:
                        self.requests += 1
                    response = self.client().chat.completions.create(
                        model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature)
            except Exception as exc:  # noqa: BLE001 - classified below
                last = exc
                if not _retryable(exc):
                    break
                continue
            text = (response.choices[0].message.content or "") if response.choices else ""
            usage = response.usage
            answer = (text, int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0))
            if self._cache is not None:
                with self._lock:
                    self._cache[key] = answer
            return answer
        attempts = attempt + 1
        raise JudgeError(f"judge {self.model} at {self.base_url} failed after {attempts} attempt(s): {type(last).__name__}: "
                         f"{str(last)[:200]}", {"judge/failed": 1.0, "judge/attempts": float(attempts)})

    # -- the reward ------------------------------------------------------------------------------

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        text, prompt_tokens, completion_tokens = self._ask(self.messages(completion, problem))
        tokens = {"tokens/judge_prompt": float(prompt_tokens), "tokens/judge_completion": float(completion_tokens)}
        score = parse_score(text, self.min_score, self.max_score)
        if score is None:
            raise JudgeError(f"judge {self.model}: no score in [{_fmt(self.min_score)}, {_fmt(self.max_score)}] in its reply "
                             f"{text[:120]!r}", {"judge/failed": 1.0, "judge/unparseable": 1.0, **tokens})
        reward = (score - self.min_score) / (self.max_score - self.min_score)
        return RewardResult(reward=reward, metrics={"judge/score": score, "judge/failed": 0.0, **tokens}, info={"judge_reply": text})


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
