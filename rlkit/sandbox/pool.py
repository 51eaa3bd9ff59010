"""Bounded parallel execution: threads that each supervise one sandboxed process."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable, Iterator, Mapping, Optional

from rlkit.errors import InvalidInputError
from rlkit.sandbox.core import ExecutionResult, SandboxLimits
from rlkit.sandbox.run import run_program


class SandboxPool:
    """Run at most ``max_workers`` sandboxed programs at a time.

    ``submit`` returns a :class:`concurrent.futures.Future` of an :class:`ExecutionResult`;
    ``map`` runs ``(source, stdin)`` jobs and yields results in job order. Use as a context
    manager or call :meth:`close`.
    """

    def __init__(self, max_workers: int = 2, *, limits: Optional[SandboxLimits] = None,
                 python: Optional[str] = None, allow_network: bool = False):
        if not isinstance(max_workers, int) or max_workers < 1:
            raise InvalidInputError(f"SandboxPool: max_workers must be a positive int, got {max_workers!r}")
        self.max_workers = max_workers
        self.limits = limits or SandboxLimits()
        self.python = python
        self.allow_network = allow_network
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="rlkit-sandbox")

    def submit(self, source: str, stdin: str = "", *, limits: Optional[SandboxLimits] = None,
               files: Optional[Mapping[str, str]] = None) -> "Future[ExecutionResult]":
        return self._executor.submit(run_program, source, stdin, limits=limits or self.limits,
                                     python=self.python, allow_network=self.allow_network,
                                     files=files)

    def map(self, jobs: Iterable[tuple[str, str]], *,
            limits: Optional[SandboxLimits] = None) -> Iterator[ExecutionResult]:
        futures = [self.submit(src, stdin, limits=limits) for src, stdin in jobs]
        for fut in futures:
            yield fut.result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
