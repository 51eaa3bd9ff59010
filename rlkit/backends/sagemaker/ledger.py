"""A run's record of the SageMaker resources it created: ``<checkpoint_dir>/sagemaker-resources.jsonl``.

With ``backend.checkpoint_dir`` set (a run sets it to ``<run_dir>/checkpoints``), the adapter
appends one JSON line per resource, **before** asking for it where it can (a session's name is
written before ``CreateTrainingSession``, so a process killed mid-creation still names it):

    {"kind": "session", "name": "rlkit-1a2b3c4d", "region": "us-west-2", "time": ...}
    {"kind": "package", "arn": "arn:aws:sagemaker:...:model-package/g/7", "package_kind": "model",
     "session": ..., "time": ...}

``rlkit sessions cleanup RUN_DIR`` reads it (and the sessions' tags in package descriptions, for a
save whose answer the process never saw) to delete what the run left behind. Lines are appended and
flushed one at a time; a torn last line is skipped when read.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

FILENAME = "sagemaker-resources.jsonl"


class Ledger:
    """Appends resource records to a file, or does nothing when no directory is given."""

    def __init__(self, directory: Optional[str]):
        self.path = Path(directory) / FILENAME if directory else None
        self._lock = threading.Lock()

    def _append(self, record: Dict[str, Any]) -> None:
        if self.path is None:
            return
        record["time"] = time.time()
        line = json.dumps(record) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()

    def session(self, name: str, *, region: str) -> None:
        self._append({"kind": "session", "name": name, "region": region})

    def package(self, arn: str, *, kind: str, session: str, description: str = "") -> None:
        self._append({"kind": "package", "arn": arn, "package_kind": kind, "session": session})


def read(path: Path) -> List[Dict[str, Any]]:
    """Every complete record of a ledger file (``[]`` if there is none)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if isinstance(record, dict):
            out.append(record)
    return out
