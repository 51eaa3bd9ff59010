"""The model check of ``backend.sampler=vllm``: a server you run must serve the trainer's base model.

A vLLM server serving another base model (another size, a fine-tune, another family) would make
every rollout off-policy; before this check that showed only as a large ``mismatch/*`` in the
first step. When rlkit first connects to a server it did not start (``backend.vllm.urls``, or a
launched server told to serve another ``backend.vllm.model``), it scores a short fixed text
(:data:`PROBE_TEXT`, about 30 tokens of the trainer's tokenizer) on the server's base model and on
the trainer's, and refuses in one line naming both models when the mean absolute difference of the
per-token logprobs exceeds :data:`TOLERANCE` for the trainer's precision.

The tolerances allow the server a coarser dtype than the trainer: measured on SmolLM2-135M, the
trainer in bf16 vs fp32 differs by 0.03 nats on average (0.15 at most) on this probe, while
different models differ by nats. ``backend.vllm.check_model=false`` skips the check, for deliberate
off-policy sampling (a teacher, an older policy).
"""

from __future__ import annotations

from typing import Any, List

from rlkit.errors import ConfigError

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and 2 + 2 = 4."
TOLERANCE = {"fp32": 0.1, "bf16": 0.2}  # mean |logprob difference| in nats over the probe's tokens, by trainer precision


def probe_tokens(tokenizer: Any) -> List[int]:
    """The probe as the trainer's tokenizer encodes it (no special tokens)."""
    return [int(t) for t in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]


def check_same_model(server_client: Any, trainer_client: Any, *, where: str, served: str, trainer_model: str,
                     precision: str) -> float:
    """Score the probe with ``server_client`` (the server's base model) and ``trainer_client`` (the
    trainer's); returns the mean absolute difference, or raises :class:`ConfigError` (one line,
    naming both models) when it is over the precision's tolerance."""
    tokens = probe_tokens(trainer_client.get_tokenizer())
    ours = trainer_client.compute_logprobs(tokens).result()[1:]
    theirs = server_client.compute_logprobs(tokens).result()[1:]
    diff = sum(abs(float(a) - float(b)) for a, b in zip(ours, theirs)) / max(1, len(ours))
    tolerance = TOLERANCE.get(precision, max(TOLERANCE.values()))
    if not diff <= tolerance:  # NaN is a mismatch too
        raise ConfigError(
            f"backend.vllm: {where} serves {served!r}, whose logprobs of a {len(tokens)}-token probe differ from the trainer's "
            f"base model {trainer_model!r} by {diff:.3g} nats a token on average (tolerance {tolerance:g} at precision {precision}): "
            f"serve {trainer_model!r} there, or set backend.vllm.check_model=false to sample from another model on purpose"
        )
    return diff
