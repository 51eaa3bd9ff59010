"""The trainer's per-token logprobs when the service does not return them: scored with the session.

Who needs the trainer's per-token logprobs: ``forward`` (the linearised losses' first pass, DPO's and
the evaluations' scoring) always; ``forward_backward`` only when asked (``return_logprobs=True``,
``run_loss(..., logprobs=True)``): the RL loop asks every ``train.mismatch_every`` steps for its
``mismatch/*`` metrics, nothing else does. A built-in loss is computed by the service itself, and SFT
and distillation read their train NLL from each datum's loss (``"loss"``, the service's
``actor/pg_loss``). ``backend.always_score_logprobs=true`` restores scoring after every pass.

The SDK documents per-datum loss outputs as ``actor/*`` diagnostics returned only when asked for,
and no request field asks. So each training client decides **once per session**, from its first
result that wants logprobs, where they come from (``backend.trainer_logprobs``):

- ``service`` — the result carries them (the permissive emulator does): used as they are;
- ``scoring`` — it does not: the session scores each datum with ``compute_logprobs`` (the cheapest
  per-token call the SDK offers) **against the weights the pass ran on**. ``compute_logprobs``
  without a model package runs on "the session's latest checkpoint", not on the training weights, so
  the client names a ``saveWeights`` package of exactly those weights: the one the loop published at
  the current weight version (the RL loop publishes before every step: no extra save), or else one it
  saves itself, right behind the pass (in sequence order, so no ``optim_step`` can come between) and
  deletes once the scores are in.

Scoring ``model_input + [last target]`` returns one logprob per position; position ``t`` of the
datum is ``log p(target_tokens[t])`` when ``target_tokens`` are the next tokens of the input (every
rlkit loop builds datums so), which is checked. Costs, reported with every result:
``logprobs:from_service`` (1 or 0), ``logprobs:scored_tokens`` (prefill tokens billed for the scoring),
``logprobs:scoring_saves`` (packages saved for it). Two limits: the scores are the *sampling*
engine's, so ``mismatch/*`` metrics then compare the sampler with itself; and ``compute_logprobs``
has no temperature, so a datum with a ``temperature`` input other than 1 cannot be scored exactly —
``forward`` refuses it, ``forward_backward`` (whose loss the service computes with the temperature)
scores at temperature 1 and says so once (``logprobs:temperature_ignored``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rlkit.backends.sagemaker import convert
from rlkit.errors import InvalidInputError
from rlkit.types import Datum, TensorData

log = logging.getLogger("rlkit.sagemaker")

SOURCES = ("auto", "service", "scoring")


@dataclass
class Weights:
    """A ``saveWeights`` package of one weight version, and who still needs it."""

    version: int
    future: Any  # rlkit APIFuture[SaveWeightsResponse]
    ephemeral: bool  # saved by rlkit for scoring/publishing, not asked for by the caller
    users: int = 0  # scorings in flight, live sampling clients
    superseded: bool = False
    deleted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self) -> None:
        with self.lock:
            self.users += 1

    def release(self, delete: Callable[["Weights"], None]) -> None:
        with self.lock:
            self.users -= 1
            due = self.ephemeral and self.superseded and self.users <= 0 and not self.deleted
            if due:
                self.deleted = True
        if due:
            delete(self)

    def retire(self, delete: Callable[["Weights"], None]) -> None:
        """The session stopped: its samplers cannot sample any more, so an ephemeral package goes
        whoever still holds a client on it."""
        with self.lock:
            self.superseded = True
            due = self.ephemeral and not self.deleted
            if due:
                self.deleted = True
        if due:
            delete(self)

    def supersede(self, delete: Callable[["Weights"], None]) -> None:
        with self.lock:
            self.superseded = True
            due = self.ephemeral and self.users <= 0 and not self.deleted
            if due:
                self.deleted = True
        if due:
            delete(self)


def scoring_prompt(datum: Datum, index: int) -> List[int]:
    """``model_input + [last target]``: one ``compute_logprobs`` prompt scoring every target."""
    tokens = datum.model_input.to_ints()
    targets = datum.loss_fn_inputs.get("target_tokens")
    if targets is None:
        raise InvalidInputError(
            f"datum[{index}]: no target_tokens; the trainer's logprobs cannot be scored without them"
        )
    targets = [int(t) for t in targets.data]
    if targets[:-1] != tokens[1:]:
        raise InvalidInputError(
            f"datum[{index}]: target_tokens are not the next tokens of model_input, so compute_logprobs cannot score "
            "them, and this SageMaker service does not return the trainer's logprobs (backend.trainer_logprobs=scoring)"
        )
    return tokens + targets[-1:]


def non_unit_temperature(data: Sequence[Datum]) -> bool:
    for d in data:
        t = d.loss_fn_inputs.get("temperature")
        if t is not None and any(abs(float(x) - 1.0) > 1e-6 for x in t.data):
            return True
    return False


def score(
    sdk_training_client: Any, model_package_arn: str, prompts: Sequence[List[int]], timeout: Optional[float]
) -> Tuple[List[TensorData], int]:
    """``compute_logprobs`` of each prompt against ``model_package_arn``: ``(the trainer's logprobs
    of each datum (position t = log p(prompt[t + 1])), prefill tokens scored)``.

    Batched: every distinct prompt is submitted at once and scored once (a GRPO group's identical
    completions share one request), then all are awaited together -- each on its own thread: an
    SDK future polls only while someone waits on it (at once, then every 2 s), so waiting on them
    one after another would cost one poll cadence per datum instead of one for the batch."""
    import concurrent.futures

    sampler = sdk_training_client.create_sampling_client(model_package_arn)
    distinct: Dict[Tuple[int, ...], Any] = {}
    for p in prompts:
        key = tuple(p)
        if key not in distinct:
            distinct[key] = sampler.compute_logprobs(convert.tokens_to_wire(list(p)))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(32, len(distinct))), thread_name_prefix="rlkit-sagemaker-score") as pool:
        results = dict(zip(distinct, pool.map(lambda f: list(f.result(timeout=timeout)), distinct.values())))
    values_of: Dict[Tuple[int, ...], TensorData] = {}
    for key, values in results.items():
        if len(values) != len(key):
            raise InvalidInputError(f"compute_logprobs returned {len(values)} values for {len(key)} tokens")
        values_of[key] = TensorData(data=[0.0 if v is None else float(v) for v in values[1:]])
    return [values_of[tuple(p)] for p in prompts], sum(len(k) for k in distinct)


__all__ = ["Weights", "SOURCES", "scoring_prompt", "non_unit_temperature", "score"]
