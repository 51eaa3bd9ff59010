"""Atomic file writes: a reader sees a file's old content or its new one, never a mix.

:func:`atomic_write` (text) and :func:`atomic_file` (any writer: a figure's ``savefig``) both
write a temporary file beside the target, fsync it, give it the mode a new file would get under
the process's umask, and rename it over the target; on any error the temporary file is removed
and the target is untouched. Run records (``config.yaml``, ``checkpoints.jsonl``,
``result.json``), plots and reports all go through here. :func:`atomic_dir` builds a whole folder (a converted model,
a task directory) the same way: the first process to finish publishes it, the others' copies go.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """``with atomic_file(path) as tmp: write(tmp)``: ``tmp`` replaces ``path`` when the block ends
    without an error (fsynced, mode ``0o666 & ~umask``); otherwise ``tmp`` is removed."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, 0o666 & ~UMASK)
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically (see the module docstring)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_dir(path: Path, prefix: str = ".build-") -> Iterator[Path]:
    """``with atomic_dir(path) as tmp: fill(tmp)``: a folder beside ``path`` that becomes ``path`` when
    the block ends without an error — unless another process published ``path`` first, then it is
    removed (both built the same thing); on an error it is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    try:
        yield tmp
        if not path.exists():
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
