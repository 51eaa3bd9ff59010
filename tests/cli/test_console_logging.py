"""rlkit's notes go to the *current* sys.stderr: a handler made while another stream was installed
(pytest's capture of an earlier test, a notebook cell) must not write to that closed stream."""

import io
import logging
import sys

from rlkit.logging import setup_console_logging


def test_notes_follow_sys_stderr_when_it_is_swapped(monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_console_logging()
    log = logging.getLogger("rlkit.runs")
    log.info("resuming %s from step %d", "run", 2)
    assert first.getvalue() == "resuming run from step 2\n"
    first.close()  # what pytest does to an earlier test's capture
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    setup_console_logging()  # idempotent: still one handler
    log.info("next note")
    assert second.getvalue() == "next note\n"
    assert sum(getattr(h, "_rlkit", False) for h in logging.getLogger("rlkit").handlers) == 1
