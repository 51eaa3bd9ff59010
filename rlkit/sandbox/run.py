"""``run_program``: the self-check (once per process), then one sandboxed run.

It sits above both :mod:`rlkit.sandbox.core` (the launcher and supervisor) and
:mod:`rlkit.sandbox.selfcheck` (the refuse-if-unprotected probe, which runs programs through
``core.execute``), so neither of those imports the other's caller.
"""

from __future__ import annotations

from typing import Mapping, Optional, Union

from rlkit.sandbox.core import ExecutionResult, SandboxLimits, execute
from rlkit.sandbox.selfcheck import ensure_available


def run_program(
    source: str,
    stdin: Union[str, bytes] = "",
    *,
    limits: Optional[SandboxLimits] = None,
    python: Optional[str] = None,
    allow_network: bool = False,
    files: Optional[Mapping[str, str]] = None,
) -> ExecutionResult:
    """Run ``source`` as ``python3 -I -S main.py`` in the sandbox, feeding ``stdin``.

    Args:
        limits: resource limits (default :class:`SandboxLimits()`).
        python: interpreter for the program (default: one the unprivileged uid can execute).
        allow_network: run even when network isolation cannot be established (unsafe). Without
            it, :class:`SandboxUnavailableError` is raised when the self-check fails.
        files: extra ``{name: text}`` files to place next to ``main.py``.
    """
    status = ensure_available(python, allow_network)
    return execute(source, stdin, limits=limits or SandboxLimits(), python=status.python,
                   allow_unisolated=status.isolation == "none", files=files)
