"""The names of lm-eval's tasks, without indexing lm-eval's whole task tree on every run.

lm-eval's ``TaskManager()`` parses all of its ~15,000 task YAMLs to learn their names (8.5 s on a
2-core CPU) every time it starts. ``rlkit eval`` needs the names to check ``tasks=`` (and suggest
near ones) and the YAML of each leaf task it runs; it keeps that index — name, kind, YAML path — as
JSON under ``$RLKIT_CACHE/harness-index``, rebuilt when the installed lm-eval (version or location)
changes. A leaf task is then loaded from its own YAML as an inline config
(:func:`rlkit.harness.tasks.select`); a group, tag or Python-class task is handed to a full
``TaskManager`` (:func:`task_manager`), built only when one is asked for. ``include_path`` (your own
task directories) is indexed by lm-eval each time, never cached.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from rlkit.files import atomic_write

KINDS = ("TASK", "PY_TASK", "GROUP", "TAG", "UNKNOWN")


@dataclass
class Catalog:
    """``entries``: task name -> (kind name, YAML path or ``None``)."""

    entries: Dict[str, Tuple[str, Optional[str]]]
    include_path: Optional[List[str]] = None
    _manager: Any = None

    @property
    def names(self) -> List[str]:
        return sorted(self.entries)

    def match(self, pattern: str) -> List[str]:
        """lm-eval's own matching of a ``--tasks`` item (a name or a glob)."""
        from lm_eval.utils import pattern_match

        return list(pattern_match([pattern], self.names))

    def leaf_yaml(self, name: str) -> Optional[Path]:
        """The YAML of a plain (YAML-defined, single) task; ``None`` for groups, tags, Python tasks."""
        kind, yaml_path = self.entries[name]
        return Path(yaml_path) if kind == "TASK" and yaml_path else None

    def task_manager(self) -> Any:
        """A full lm-eval ``TaskManager`` (indexing every task: slow), made once."""
        if self._manager is None:
            from lm_eval.tasks import TaskManager

            self._manager = TaskManager(include_path=self.include_path)
        return self._manager


def _index_file() -> Path:
    import lm_eval

    from rlkit.backends.local.models import cache_dir

    where = str(Path(lm_eval.__file__).resolve().parent)
    key = hashlib.sha256(f"{lm_eval.__version__}|{where}".encode()).hexdigest()[:16]
    return cache_dir() / "harness-index" / f"lm_eval-{lm_eval.__version__}-{key}.json"


def _entries(manager: Any) -> Dict[str, Tuple[str, Optional[str]]]:
    return {name: (entry.kind.name, str(entry.yaml_path) if entry.yaml_path else None)
            for name, entry in manager.task_index.items()}


def load_catalog(include_path: Optional[List[str]] = None) -> Catalog:
    """The catalog of lm-eval's tasks (cached; with ``include_path``, freshly indexed)."""
    if include_path:
        catalog = Catalog({}, include_path=list(include_path))
        catalog.entries = _entries(catalog.task_manager())
        return catalog
    path = _index_file()
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        return Catalog({k: (v[0], v[1]) for k, v in stored["entries"].items()})
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    catalog = Catalog({})
    catalog.entries = _entries(catalog.task_manager())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"entries": catalog.entries}))
    except OSError:  # a read-only cache: index again next time
        pass
    return catalog
