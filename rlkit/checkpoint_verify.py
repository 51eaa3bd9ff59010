"""Which checkpoint a run resumes from: the newest one whose files verify.

A run's ``checkpoints.jsonl`` lists its checkpoints in order. Before a resumed run restores the
last one, :func:`restorable_records` checks it (:func:`checkpoint_problem`); if it is corrupt or
gone, the run falls back to the newest earlier checkpoint that verifies, and says so in one line:
which checkpoint was refused and why, which one the run resumes from, and how many steps that
costs (they are recomputed; on a deterministic backend the run still ends as if never stopped).

Only ``local://`` checkpoints can be checked here (their files carry sizes and SHA-256s, see
:mod:`rlkit.backends.local.checkpoints`); a remote id (a SageMaker model-package ARN) is trusted,
and its service reports its own errors when it is loaded.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from rlkit.errors import CheckpointCorruptError, CheckpointNotFoundError


def checkpoint_problem(checkpoint: str) -> Optional[str]:
    """Why ``checkpoint`` cannot be restored (one line), or ``None`` if it verifies (or is not a
    local checkpoint, which cannot be checked from here)."""
    from rlkit.backends.local import checkpoints as ckpt

    if not isinstance(checkpoint, str) or not checkpoint.startswith(ckpt.SCHEME):
        return None
    try:
        ckpt.verify(checkpoint)
    except (CheckpointCorruptError, CheckpointNotFoundError) as exc:
        return str(exc)
    return None


def restorable_records(records: Sequence[Dict[str, Any]], warn: Callable[[str], Any]) -> List[Dict[str, Any]]:
    """``records`` up to and including the newest whose checkpoint verifies. When newer ones are
    dropped, ``warn`` gets one line saying which, why, where the run resumes and what it costs."""
    kept = list(records)
    refused: List[Dict[str, Any]] = []
    first_problem = ""
    while kept:
        problem = checkpoint_problem(str(kept[-1].get("checkpoint", "")))
        if problem is None:
            break
        first_problem = first_problem or problem
        refused.append(kept.pop())
    if not refused:
        return kept
    newest = int(refused[0].get("step", 0))
    steps = ", ".join(str(r.get("step")) for r in reversed(refused))
    back_to = int(kept[-1].get("step", 0)) if kept else 0
    if kept:
        where = f"resuming from the checkpoint of step {back_to} ({kept[-1].get('checkpoint')})"
    else:
        where = "no earlier checkpoint verifies: starting over from step 0"
    warn(
        f"checkpoint{'s' if len(refused) > 1 else ''} of step{'s' if len(refused) > 1 else ''} {steps} "
        f"cannot be restored ({first_problem}); {where}: {newest - back_to} step(s) will be recomputed"
    )
    return kept


def records_through(records: Sequence[Dict[str, Any]], chosen: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``records`` up to and including ``chosen`` (matched by step and checkpoint); none if
    ``chosen`` is ``None``; all of them if it is not among them."""
    if chosen is None:
        return []
    key = (chosen.get("step"), chosen.get("checkpoint"))
    for i, record in enumerate(records):
        if (record.get("step"), record.get("checkpoint")) == key:
            return list(records[: i + 1])
    return list(records)
