"""rlkit.files.atomic_dir: a folder appears whole or not at all; the first publisher wins."""

from __future__ import annotations

import pytest

from rlkit.files import atomic_dir


def test_the_folder_appears_whole_when_the_block_ends(tmp_path):
    target = tmp_path / "cache" / "model"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("1")
        assert not target.exists()  # nothing visible while it is being built
    assert (target / "a.txt").read_text() == "1"
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no temporary folder left


def test_a_folder_another_process_published_first_is_kept(tmp_path):
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "mine.txt").write_text("late")
        target.mkdir()
        (target / "theirs.txt").write_text("first")
    assert sorted(p.name for p in target.iterdir()) == ["theirs.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_an_error_leaves_nothing(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "half.txt").write_text("x")
            raise RuntimeError("conversion failed")
    assert list(tmp_path.iterdir()) == []
