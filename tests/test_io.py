"""Atomic writes: all or nothing, with ordinary permissions."""

from __future__ import annotations

import os
import stat

import pytest

from bertology.io import atomic_directory, atomic_write


def test_atomic_write_replaces_or_keeps(tmp_path):
    path = tmp_path / "out.txt"
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write("first")
    with pytest.raises(RuntimeError):
        with atomic_write(path, "w", encoding="utf-8") as handle:
            handle.write("second, half written")
            raise RuntimeError("killed")
    assert path.read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_permissions_follow_the_umask(tmp_path):
    mask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "f", "w") as handle:
            handle.write("x")
        with atomic_directory(tmp_path / "d") as directory:
            (directory / "a").write_text("x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_atomic_directory_replaces_whole(tmp_path):
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "old").write_text("1")
    with atomic_directory(tmp_path / "d") as directory:
        (directory / "new").write_text("2")
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
