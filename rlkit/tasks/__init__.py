"""RL tasks: problems + prompt rendering + reward, turned into environment groups.

A task has ``problems(split) -> list[dict]``, ``env_group(problem, tokenizer) -> EnvGroup`` and a
``name``. Built-in tasks: ``arithmetic`` (generated 2-digit problems), ``gsm8k`` (grade-school
maths), ``code`` (competitive programming, multi-turn; see ``rlkit.tasks.code``). A config selects
one with ``task.name`` or plugs in a user class with ``task._target_``.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Mapping

from rlkit.errors import ConfigError

TASKS: Dict[str, str] = {
    "arithmetic": "rlkit.tasks.arithmetic:ArithmeticTask",
    "gsm8k": "rlkit.tasks.gsm8k:GSM8KTask",
    "code": "rlkit.tasks.code:CodeTask",
}


def _load(path: str) -> Any:
    module, _, attr = path.replace(":", ".").rpartition(".") if ":" not in path else path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"task class {path!r} cannot be imported ({exc})") from None


def build_task(spec: Mapping[str, Any]) -> Any:
    """A task from ``{name | _target_, **options}``."""
    spec = dict(spec)
    if spec.get("_target_"):
        cls = _load(spec.pop("_target_"))
        spec.pop("name", None)
    else:
        name = spec.pop("name", None)
        if name not in TASKS:
            raise ConfigError(f"task.name={name!r}: unknown task; choose from {sorted(TASKS)} or set task._target_")
        cls = _load(TASKS[name])
    try:
        return cls(**spec)
    except TypeError as exc:
        raise ConfigError(f"task: {exc}") from None
