"""The session contract as a test suite: ``rlkit conformance ENGINE`` (see :mod:`.checks`)."""

from rlkit.conformance.checks import Result, failed, run_suite, summary

__all__ = ["Result", "failed", "run_suite", "summary"]
