"""rlkit's notes go to the *current* sys.stderr: a handler made while another stream was installed
(pytest's capture of an earlier test, a notebook cell) must not write to that closed stream."""

import io
import logging
import os
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


def test_progress_is_a_live_rich_line_on_a_terminal_and_plain_lines_otherwise(monkeypatch):
    from rlkit.logging import ConsoleSink

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, live in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stdout", stream)
        sink = ConsoleSink(3, log_every=1)
        assert sink.live is live
        for step in range(3):
            sink.log(step, {"train/nll": 2.0 - step / 4, "train/lr": 1e-3})
        sink.close()
        text = stream.getvalue()
        if live:  # rich redraws one progress line: bar, 3/3, the latest metrics; no line per step
            assert "3/3" in text and "nll 1.5" in text and "train step" not in text
        else:
            assert [ln.split("  ")[0] for ln in text.splitlines()] == [
                "train step 0 (1/3)",
                "train step 1 (2/3)",
                "train step 2 (3/3)",
            ]


def test_quiet_libraries_hides_their_progress_bars_and_notes_unless_verbose(monkeypatch, capsys):
    from transformers.utils import logging as hf_logging

    from rlkit.backends.local.models import _gguf_bar_follows_transformers
    from rlkit.logging import quiet_libraries

    for key in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(key, "")  # so that monkeypatch restores what was there
        monkeypatch.delenv(key)
    monkeypatch.setattr(logging.getLogger("matplotlib"), "level", logging.NOTSET)
    hf_logging.enable_progress_bar()
    try:
        quiet_libraries(verbose=True)
        assert hf_logging.is_progress_bar_enabled() and logging.getLogger("matplotlib").level == logging.NOTSET
        quiet_libraries()
        assert not hf_logging.is_progress_bar_enabled()
        assert (
            logging.getLogger("matplotlib").getEffectiveLevel() == logging.WARNING
        )  # "generated new fontManager" is INFO
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # for libraries imported later, workers
        # transformers' GGUF reader uses plain tqdm; during rlkit's conversion it follows the switch
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        capsys.readouterr()
        with _gguf_bar_follows_transformers():
            list(gguf_utils.tqdm(range(5), desc="Converting and de-quantizing GGUF tensors..."))
        assert "Converting" not in capsys.readouterr().err
        hf_logging.enable_progress_bar()  # verbose=true: the bar is back
        with _gguf_bar_follows_transformers():
            list(gguf_utils.tqdm(range(5), desc="Converting and de-quantizing GGUF tensors..."))
        assert "Converting and de-quantizing GGUF tensors" in capsys.readouterr().err
    finally:
        hf_logging.enable_progress_bar()
        hf_logging.set_verbosity_warning()
